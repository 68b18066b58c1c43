package evidence_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

func TestRecordObservationValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	valid := func(edit func(*evidencev1.SourceObservation)) *evidencev1.SourceObservation {
		o := observation("task_v", "conn_v", "notes://a", "content")
		edit(o)
		return o
	}
	tests := []struct {
		name   string
		obs    *evidencev1.SourceObservation
		fields []string
	}{
		{"missing observation", nil, []string{"observation"}},
		{"empty observation", &evidencev1.SourceObservation{}, []string{
			"observation.connection_id", "observation.resource_uri", "observation.content_digest",
			"observation.media_type", "observation.request_id",
		}},
		{"no connection", valid(func(o *evidencev1.SourceObservation) { o.ConnectionId = "" }), []string{"observation.connection_id"}},
		{"no uri", valid(func(o *evidencev1.SourceObservation) { o.ResourceUri = "" }), []string{"observation.resource_uri"}},
		{"no media type", valid(func(o *evidencev1.SourceObservation) { o.MediaType = "" }), []string{"observation.media_type"}},
		{"no request", valid(func(o *evidencev1.SourceObservation) { o.RequestId = "" }), []string{"observation.request_id"}},
		{"digest without prefix", valid(func(o *evidencev1.SourceObservation) { o.ContentDigest = o.ContentDigest[len("sha256:"):] }), []string{"observation.content_digest"}},
		{"digest upper-case hex", valid(func(o *evidencev1.SourceObservation) {
			o.ContentDigest = "sha256:" + "ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789"
		}), []string{"observation.content_digest"}},
		{"digest too short", valid(func(o *evidencev1.SourceObservation) { o.ContentDigest = "sha256:abc" }), []string{"observation.content_digest"}},
		{"other algorithm", valid(func(o *evidencev1.SourceObservation) { o.ContentDigest = "md5:" + o.ContentDigest[7:] }), []string{"observation.content_digest"}},
		{"negative size", valid(func(o *evidencev1.SourceObservation) { o.SizeBytes = -1 }), []string{"observation.size_bytes"}},
		{"passage without id", valid(func(o *evidencev1.SourceObservation) {
			o.Passages = append(o.Passages, &evidencev1.Passage{Text: "x"})
		}), []string{"observation.passages[1].passage_id"}},
		{"duplicate passage id", valid(func(o *evidencev1.SourceObservation) {
			o.Passages = append(o.Passages, &evidencev1.Passage{PassageId: "p1", Text: "again"})
		}), []string{"observation.passages[1].passage_id"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := e.client.RecordObservation(t.Context(), &evidencev1.RecordObservationRequest{Observation: tc.obs})
			wantError(t, err, codes.InvalidArgument, "OBSERVATION_INVALID", tc.fields...)
		})
	}
	// Nothing was stored by the refused calls.
	revs, err := e.client.ListRevisions(t.Context(), &evidencev1.ListRevisionsRequest{ConnectionId: "conn_v", ResourceUri: "notes://a"})
	if err != nil {
		t.Fatalf("ListRevisions: %v", err)
	}
	if len(revs.GetRevisions()) != 0 {
		t.Errorf("refused observations created revisions: %v", revs.GetRevisions())
	}
}

func TestObservationRevisions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const conn, uri = "conn_notes", "notes://migration/plan"

	first := record(t, e, observation("task_1", conn, uri, "v1: the API moves in May"))
	if first.GetId() == "" || first.GetRevisionId() == "" || first.GetRevisionNumber() != 1 {
		t.Fatalf("first observation = id %q revision %q #%d, want ids assigned and revision 1", first.GetId(), first.GetRevisionId(), first.GetRevisionNumber())
	}
	if !first.GetRetrieveTime().AsTime().Equal(t0) {
		t.Errorf("retrieve_time = %v, want the server's now %v", first.GetRetrieveTime().AsTime(), t0)
	}

	e.clock.Advance(1)
	same := record(t, e, observation("task_1", conn, uri, "v1: the API moves in May"))
	if same.GetId() == first.GetId() {
		t.Errorf("second observation reused id %q", same.GetId())
	}
	if same.GetRevisionId() != first.GetRevisionId() || same.GetRevisionNumber() != 1 {
		t.Errorf("same digest: revision %q #%d, want %q #1", same.GetRevisionId(), same.GetRevisionNumber(), first.GetRevisionId())
	}

	changed := observation("task_2", conn, uri, "v2: the API moves in June, pending review")
	changed.RetrieveTime = timestamppb.New(t0.Add(time.Hour))
	second := record(t, e, changed)
	if second.GetRevisionNumber() != 2 || second.GetRevisionId() == first.GetRevisionId() {
		t.Fatalf("new digest: revision %q #%d, want a new revision #2", second.GetRevisionId(), second.GetRevisionNumber())
	}
	if !second.GetRetrieveTime().AsTime().Equal(t0.Add(time.Hour)) {
		t.Errorf("caller's retrieve_time not kept: %v", second.GetRetrieveTime().AsTime())
	}

	// Reading the old content again joins revision 1; it is not a third.
	back := record(t, e, observation("task_2", conn, uri, "v1: the API moves in May"))
	if back.GetRevisionId() != first.GetRevisionId() || back.GetRevisionNumber() != 1 {
		t.Errorf("old digest again: revision %q #%d, want %q #1", back.GetRevisionId(), back.GetRevisionNumber(), first.GetRevisionId())
	}

	// The same URI on another connection is another source.
	other := record(t, e, observation("task_1", "conn_other", uri, "v2: the API moves in June, pending review"))
	if other.GetRevisionNumber() != 1 || other.GetRevisionId() == second.GetRevisionId() {
		t.Errorf("other connection: revision %q #%d, want its own revision #1", other.GetRevisionId(), other.GetRevisionNumber())
	}

	revs, err := e.client.ListRevisions(t.Context(), &evidencev1.ListRevisionsRequest{ConnectionId: conn, ResourceUri: uri})
	if err != nil {
		t.Fatalf("ListRevisions: %v", err)
	}
	want := []*evidencev1.SourceRevision{
		{Id: first.GetRevisionId(), ConnectionId: conn, ResourceUri: uri, Number: 1, ContentDigest: first.GetContentDigest(),
			FirstObservationId: first.GetId(), FirstSeenTime: timestamppb.New(t0)},
		{Id: second.GetRevisionId(), ConnectionId: conn, ResourceUri: uri, Number: 2, ContentDigest: second.GetContentDigest(),
			FirstObservationId: second.GetId(), FirstSeenTime: timestamppb.New(t0.Add(time.Hour))},
	}
	if len(revs.GetRevisions()) != len(want) {
		t.Fatalf("ListRevisions = %v, want %v", revs.GetRevisions(), want)
	}
	for i := range want {
		if !proto.Equal(revs.GetRevisions()[i], want[i]) {
			t.Errorf("revision %d = %v, want %v", i+1, revs.GetRevisions()[i], want[i])
		}
	}

	// A task's observations come back oldest first, and only that task's.
	list, err := e.client.ListObservations(t.Context(), &evidencev1.ListObservationsRequest{TaskId: "task_1"})
	if err != nil {
		t.Fatalf("ListObservations: %v", err)
	}
	var gotIDs []string
	for _, o := range list.GetObservations() {
		gotIDs = append(gotIDs, o.GetId())
	}
	wantIDs := []string{first.GetId(), same.GetId(), other.GetId()}
	if len(gotIDs) != len(wantIDs) {
		t.Fatalf("task_1 observations = %v, want %v", gotIDs, wantIDs)
	}
	for i := range wantIDs {
		if gotIDs[i] != wantIDs[i] {
			t.Errorf("task_1 observations = %v, want %v", gotIDs, wantIDs)
			break
		}
	}

	got, err := e.client.GetObservation(t.Context(), &evidencev1.GetObservationRequest{Id: second.GetId()})
	if err != nil {
		t.Fatalf("GetObservation: %v", err)
	}
	if !proto.Equal(got, second) {
		t.Errorf("GetObservation = %v, want what RecordObservation returned %v", got, second)
	}
}

func TestObservationOutputFieldsAssigned(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	o := observation("task_o", "conn_o", "notes://o", "body")
	o.Id, o.RevisionId, o.RevisionNumber = "obs_chosen_by_caller", "rev_chosen_by_caller", 7
	o.Passages = nil
	got := record(t, e, o)
	if got.GetId() == "obs_chosen_by_caller" || got.GetRevisionId() == "rev_chosen_by_caller" || got.GetRevisionNumber() != 1 {
		t.Errorf("caller chose output fields: id %q revision %q #%d", got.GetId(), got.GetRevisionId(), got.GetRevisionNumber())
	}
	if len(got.GetPassages()) != 0 {
		t.Errorf("passages invented: %v", got.GetPassages())
	}
}

func TestObservationReadErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, err := e.client.GetObservation(t.Context(), &evidencev1.GetObservationRequest{Id: "obs_nope"})
	wantError(t, err, codes.NotFound, "OBSERVATION_UNKNOWN")

	tests := []struct {
		name   string
		call   func(context.Context) error
		fields []string
	}{
		{"get without id", func(ctx context.Context) error {
			_, err := e.client.GetObservation(ctx, &evidencev1.GetObservationRequest{})
			return err
		}, []string{"id"}},
		{"list without task", func(ctx context.Context) error {
			_, err := e.client.ListObservations(ctx, &evidencev1.ListObservationsRequest{})
			return err
		}, []string{"task_id"}},
		{"revisions without source", func(ctx context.Context) error {
			_, err := e.client.ListRevisions(ctx, &evidencev1.ListRevisionsRequest{})
			return err
		}, []string{"connection_id", "resource_uri"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			wantError(t, tc.call(t.Context()), codes.InvalidArgument, "FIELD_INVALID", tc.fields...)
		})
	}
}

// A retried RecordObservation under its idempotency key (the first answer
// was lost: evidence stopped after storing it) returns the observation
// stored first and stores nothing more; another observation under the
// key is refused, and without a key every call is a new observation.
func TestRecordObservationIdempotencyKey(t *testing.T) {
	t.Parallel()
	const conn, uri = "conn_idem", "notes://idem"
	first := observation("task_idem", conn, uri, "the read")
	tests := []struct {
		name string
		key  string
		edit func(*evidencev1.SourceObservation)
		// stored is how many observations the task has after the retry.
		stored int
		reason string
	}{
		{"the same observation again", "att_1/a", func(*evidencev1.SourceObservation) {}, 1, ""},
		{"the same content retrieved later", "att_1/a", func(o *evidencev1.SourceObservation) { o.RetrieveTime = timestamppb.New(t0.Add(time.Minute)) }, 1, ""},
		{"other content under the key", "att_1/a", func(o *evidencev1.SourceObservation) { o.ContentDigest = contentDigest("other") }, 1, "IDEMPOTENCY_KEY_REUSED"},
		{"another request under the key", "att_1/a", func(o *evidencev1.SourceObservation) { o.RequestId = "att_2" }, 1, "IDEMPOTENCY_KEY_REUSED"},
		{"another source under the key", "att_1/a", func(o *evidencev1.SourceObservation) { o.ResourceUri = "notes://other" }, 1, "IDEMPOTENCY_KEY_REUSED"},
		{"no key", "", func(*evidencev1.SourceObservation) {}, 2, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			stored, err := e.client.RecordObservation(t.Context(), &evidencev1.RecordObservationRequest{Observation: first, IdempotencyKey: tc.key})
			if err != nil {
				t.Fatalf("first record: %v", err)
			}
			again := proto.CloneOf(first)
			tc.edit(again)
			got, err := e.client.RecordObservation(t.Context(), &evidencev1.RecordObservationRequest{Observation: again, IdempotencyKey: tc.key})
			switch {
			case tc.reason != "":
				wantError(t, err, codes.AlreadyExists, tc.reason)
			case err != nil:
				t.Fatalf("retry: %v", err)
			case tc.key != "" && !proto.Equal(got, stored):
				t.Errorf("retry returned %v, want the first observation %v", got, stored)
			case tc.key == "" && got.GetId() == stored.GetId():
				t.Errorf("without a key the second call returned the first observation %s", got.GetId())
			}
			list, err := e.client.ListObservations(t.Context(), &evidencev1.ListObservationsRequest{TaskId: first.GetTaskId()})
			if err != nil {
				t.Fatal(err)
			}
			if n := len(list.GetObservations()); n != tc.stored {
				t.Errorf("the task has %d observations, want %d", n, tc.stored)
			}
		})
	}
}
