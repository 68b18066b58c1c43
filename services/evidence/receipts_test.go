package evidence_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

func TestReceiptIdempotentUnderConcurrency(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 20
	got := make([]*evidencev1.Receipt, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			got[i], errs[i] = e.client.RecordReceipt(t.Context(), &evidencev1.RecordReceiptRequest{Receipt: &evidencev1.Receipt{
				IdempotencyKey: "intent_deliver_1",
				TaskId:         "task_r",
				AttemptId:      fmt.Sprintf("att_%d", i),
				DeliveryId:     fmt.Sprintf("delivery_%d", i),
			}})
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("RecordReceipt %d: %v", i, errs[i])
		}
		if !proto.Equal(got[i], got[0]) {
			t.Errorf("caller %d got %v, caller 0 got %v: want one receipt", i, got[i], got[0])
		}
	}
	stored, err := e.client.GetReceipt(t.Context(), &evidencev1.GetReceiptRequest{IdempotencyKey: "intent_deliver_1"})
	if err != nil {
		t.Fatalf("GetReceipt: %v", err)
	}
	if !proto.Equal(stored, got[0]) || stored.GetId() == "" || !stored.GetRecordTime().AsTime().Equal(t0) {
		t.Errorf("GetReceipt = %v, want the one receipt %v with an id and record time %v", stored, got[0], t0)
	}
	// The winning receipt is one caller's, whole: attempt and delivery agree.
	if strings.TrimPrefix(stored.GetAttemptId(), "att_") != strings.TrimPrefix(stored.GetDeliveryId(), "delivery_") {
		t.Errorf("receipt mixes callers: %v", stored)
	}
}

func TestReceiptSecondRecordReturnsFirst(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	detail, _ := structpb.NewStruct(map[string]any{"channel": "email", "smtp_password": "hunter2-secret"})
	first, err := e.client.RecordReceipt(t.Context(), &evidencev1.RecordReceiptRequest{Receipt: &evidencev1.Receipt{
		IdempotencyKey: "intent_1", TaskId: "task_1", AttemptId: "att_1", ArtifactDigest: contentDigest("artifact"), DeliveryId: "d_1", Detail: detail,
	}})
	if err != nil {
		t.Fatalf("RecordReceipt: %v", err)
	}
	if strings.Contains(first.String(), "hunter2") || first.GetDetail().AsMap()["channel"] != "email" {
		t.Errorf("receipt detail not redacted or safe detail lost: %v", first.GetDetail())
	}
	e.clock.Advance(1)
	again, err := e.client.RecordReceipt(t.Context(), &evidencev1.RecordReceiptRequest{Receipt: &evidencev1.Receipt{
		IdempotencyKey: "intent_1", TaskId: "task_1", AttemptId: "att_2", DeliveryId: "d_2",
	}})
	if err != nil {
		t.Fatalf("RecordReceipt again: %v", err)
	}
	if !proto.Equal(again, first) {
		t.Errorf("second record returned %v, want the first receipt unchanged %v", again, first)
	}
	other, err := e.client.RecordReceipt(t.Context(), &evidencev1.RecordReceiptRequest{Receipt: &evidencev1.Receipt{IdempotencyKey: "intent_2"}})
	if err != nil {
		t.Fatalf("RecordReceipt other key: %v", err)
	}
	if other.GetId() == first.GetId() {
		t.Errorf("different keys share receipt id %q", other.GetId())
	}
}

func TestReceiptErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tests := []struct {
		name   string
		r      *evidencev1.Receipt
		fields []string
	}{
		{"missing receipt", nil, []string{"receipt"}},
		{"no key", &evidencev1.Receipt{TaskId: "task_1", DeliveryId: "d"}, []string{"receipt.idempotency_key"}},
		{"key too long", &evidencev1.Receipt{IdempotencyKey: strings.Repeat("k", 1025)}, []string{"receipt.idempotency_key"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := e.client.RecordReceipt(t.Context(), &evidencev1.RecordReceiptRequest{Receipt: tc.r})
			wantError(t, err, codes.InvalidArgument, "RECEIPT_INVALID", tc.fields...)
		})
	}
	_, err := e.client.GetReceipt(t.Context(), &evidencev1.GetReceiptRequest{IdempotencyKey: "intent_never"})
	wantError(t, err, codes.NotFound, "RECEIPT_UNKNOWN")
	_, err = e.client.GetReceipt(t.Context(), &evidencev1.GetReceiptRequest{})
	wantError(t, err, codes.InvalidArgument, "FIELD_INVALID", "idempotency_key")
}
