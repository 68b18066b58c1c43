package evidence

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/failpoint"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/receipt"
	"github.com/v0m3/v0m3/internal/redact"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// maxIdempotencyKeyBytes bounds the key, which is also the storage key.
const maxIdempotencyKeyBytes = 1024

// RecordReceipt stores evidence that an effect happened. Recording the same
// idempotency key again returns the first receipt unchanged, so a retried
// delivery can never produce a second receipt for one intent. A receipt is
// stored only with the adapter's attestation of exactly it (same intent,
// task, attempt, artifact and delivery): whoever calls, a receipt the
// adapter did not observe is refused and changes nothing.
func (s *Server) RecordReceipt(ctx context.Context, req *evidencev1.RecordReceiptRequest) (*evidencev1.Receipt, error) {
	in := req.GetReceipt()
	if vs := validateReceipt(in); len(vs) > 0 {
		return nil, apierror.InvalidArgument("RECEIPT_INVALID", "the receipt is incomplete or malformed; see the field violations", vs...)
	}
	if s.creds != nil {
		if _, err := receipt.Check(s.creds, in); err != nil {
			var re *receipt.Error
			if !errors.As(err, &re) {
				re = &receipt.Error{Reason: receipt.ReasonInvalid, Msg: err.Error()}
			}
			s.log.WarnContext(ctx, "receipt refused: not attested by the adapter", "reason", re.Reason, "field", re.Field,
				"task_id", in.GetTaskId(), "attempt_id", in.GetAttemptId(), "caller", identity.PeerFrom(ctx))
			var md map[string]string
			if re.Field != "" {
				md = map[string]string{"field": re.Field}
			}
			return nil, apierror.New(codes.PermissionDenied, re.Reason, re.Msg, md)
		}
	}
	r := proto.CloneOf(in)
	r.Id = ids.New("rcpt")
	r.RecordTime = s.timestamp()
	// Detail is meant to be safe already; redacting secret-looking names
	// is defense in depth, as for trace arguments.
	r.Detail = redact.Struct(r.GetDetail())
	failpoint.Hit(FailPointReceiptBefore)
	out, created, err := s.st.CreateReceipt(ctx, r)
	if err != nil {
		return nil, s.storeError(ctx, err, "record receipt", "", "", nil)
	}
	failpoint.Hit(FailPointReceiptAfter)
	s.log.InfoContext(ctx, "receipt recorded", "receipt_id", out.GetId(), "task_id", out.GetTaskId(),
		"attempt_id", out.GetAttemptId(), "created", created)
	return out, nil
}

func validateReceipt(r *evidencev1.Receipt) []apierror.FieldViolation {
	if r == nil {
		return []apierror.FieldViolation{{Field: "receipt", Description: "required"}}
	}
	vs := required(nil, [2]string{"receipt.idempotency_key", r.GetIdempotencyKey()})
	if len(r.GetIdempotencyKey()) > maxIdempotencyKeyBytes {
		vs = append(vs, apierror.FieldViolation{Field: "receipt.idempotency_key", Description: "longer than 1024 bytes"})
	}
	return vs
}

// GetReceipt looks a receipt up by its idempotency key.
func (s *Server) GetReceipt(ctx context.Context, req *evidencev1.GetReceiptRequest) (*evidencev1.Receipt, error) {
	if req.GetIdempotencyKey() == "" {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "an idempotency key is required", apierror.FieldViolation{Field: "idempotency_key", Description: "required"})
	}
	r, err := s.st.GetReceipt(ctx, req.GetIdempotencyKey())
	if err != nil {
		// The key itself is not echoed back: keys are chosen by callers and
		// need not be safe to show.
		return nil, s.storeError(ctx, err, "get receipt", "RECEIPT_UNKNOWN", "no receipt has been recorded under this idempotency key", nil)
	}
	return r, nil
}
