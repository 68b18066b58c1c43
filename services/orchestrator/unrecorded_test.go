package orchestrator

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// A read whose observation evidence could not record is neither failed
// nor lost: the caller gets UNAVAILABLE with the request id, the request
// waits with its attempt open at RESULT_OBSERVED (outcome OK,
// OBSERVATION_NOT_RECORDED), and recovery records it once evidence is
// back and commits it, from the result it held: one read, each
// observation stored once (evidence that stored one and lost its answer
// is asked again under the same idempotency key), each traced once.
func TestReadWhoseObservationWasNotRecordedWaitsForEvidence(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// fault breaks evidence's RecordObservation or policy's charge
		// of the response; heal, when set, repairs it once the waiting
		// request was seen.
		fault, heal func(*harness)
	}{
		{"evidence down", func(h *harness) { h.evidence.down = true }, func(h *harness) { h.evidence.down = false }},
		{"evidence stored it and its answer was lost", func(h *harness) { h.evidence.loseAnswers = 1 }, nil},
		{"policy down when the response is charged", func(h *harness) { h.policy.responsesDown = true }, func(h *harness) { h.policy.responsesDown = false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(d *Deps) { d.RecoveryInterval = 20 * time.Millisecond })
			cat := h.start(t, "source_review", false).GetCatalogue()
			change := func(f func(*harness)) {
				h.evidence.mu.Lock()
				h.policy.mu.Lock()
				f(h)
				h.policy.mu.Unlock()
				h.evidence.mu.Unlock()
			}
			change(tc.fault)
			_, err := h.submit(t, cat.GetTaskId(), "call_1", capRetrieveAuthorizedSource,
				map[string]any{"source": handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())})
			wantErr(t, err, codes.Unavailable, codeObservationNotRecorded)
			id := requestOfCall(t, h, cat.GetTaskId(), "call_1").GetId()
			if tc.heal != nil {
				// Evidence stays down: recovery passes leave the request
				// waiting as it is.
				wantAwaitingObservation(t, h, id)
				change(tc.heal)
			}
			wantRecordedOnce(t, h, cat.GetTaskId(), id)
		})
	}
}

// requestOfCall returns the request of a provider call.
func requestOfCall(t *testing.T, h *harness, taskID, callID string) *orchestratorv1.ToolRequest {
	t.Helper()
	list, err := h.client.ListRequests(t.Context(), &orchestratorv1.ListRequestsRequest{TaskId: taskID})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list.GetRequests() {
		if r.GetProviderCallId() == callID {
			return r
		}
	}
	t.Fatalf("no request of provider call %s", callID)
	return nil
}

// wantAwaitingObservation fails unless request id honestly waits for its
// observation: not settled, its one attempt open at RESULT_OBSERVED with
// outcome OK and OBSERVATION_NOT_RECORDED, nothing quoted.
func wantAwaitingObservation(t *testing.T, h *harness, id string) {
	t.Helper()
	var r *orchestratorv1.ToolRequest
	// Waits for the state the call that failed persists (the caller may
	// have stopped waiting before it did).
	testkit.Eventually(t, "the request awaiting its observation", func() bool {
		var err error
		r, err = h.client.GetRequest(t.Context(), &orchestratorv1.GetRequestRequest{Id: id})
		if err != nil {
			t.Fatal(err)
		}
		return awaitsObservation(openAttempt(r)) || settled(r)
	})
	a := openAttempt(r)
	if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_REQUESTED || len(r.GetAttempts()) != 1 || a == nil ||
		a.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED || a.GetOutcome() != adapterv1.Outcome_OUTCOME_OK ||
		a.GetError().GetSafeCode() != codeObservationNotRecorded || len(r.GetExcerpts()) != 0 {
		t.Fatalf("request while evidence cannot record = %v; want REQUESTED, one open attempt at RESULT_OBSERVED, OK, %s", r, codeObservationNotRecorded)
	}
}

// wantRecordedOnce waits for request id to be settled and fails unless it
// was executed from one read, with its observations stored and traced
// once each.
func wantRecordedOnce(t *testing.T, h *harness, taskID, id string) {
	t.Helper()
	var r *orchestratorv1.ToolRequest
	testkit.Eventually(t, "the request settled", func() bool {
		var err error
		r, err = h.client.GetRequest(t.Context(), &orchestratorv1.GetRequestRequest{Id: id})
		if err != nil {
			t.Fatal(err)
		}
		return settled(r)
	})
	if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK ||
		len(r.GetAttempts()) != 1 || r.GetAttempts()[0].GetError() != nil || len(r.GetExcerpts()) == 0 {
		t.Fatalf("request = %v; want EXECUTED / OK from its one attempt, with excerpts", r)
	}
	if n := h.adapter.calls.Load(); n != 1 {
		t.Errorf("the server was called %d times, want once", n)
	}
	obs := h.evidence.observationsOf(taskID)
	seen := map[string]bool{}
	for _, o := range obs {
		k := o.GetRequestId() + " " + o.GetResourceUri() + " " + o.GetContentDigest()
		if seen[k] {
			t.Errorf("observation of %s stored twice", k)
		}
		seen[k] = true
	}
	if len(obs) == 0 || r.GetExcerpts()[0].GetObservationId() != obs[0].GetId() {
		t.Errorf("observations %v; the excerpts quote %s", obs, r.GetExcerpts()[0].GetObservationId())
	}
	// The trace tells of each observation and each diagnostic once: what
	// an attempt to record that failed traced was not kept.
	testkit.Eventually(t, "the request's consequence traced", func() bool {
		for _, e := range h.evidence.product(taskID) {
			if e.GetRequestId() == id && e.GetKind() == evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_CONSEQUENCE {
				return true
			}
		}
		return false
	})
	var recorded, diagnostics int
	for _, e := range h.evidence.product(taskID) {
		switch {
		case e.GetRequestId() != id:
		case e.GetKind() == evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_OBSERVATION_RECORDED:
			recorded++
		case e.GetKind() == evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_DIAGNOSTIC:
			diagnostics++
		}
	}
	if recorded != len(obs) || diagnostics != len(r.GetDiagnostics()) {
		t.Errorf("traced %d observations and %d diagnostics; want %d and %d", recorded, diagnostics, len(obs), len(r.GetDiagnostics()))
	}
}

// A replica whose request was taken over while its read was in flight
// (frozen past its lease) writes nothing of the read: persisting the
// attempt's stage is fenced, and it then neither records observations in
// evidence nor commits. The new owner's account is the only one.
func TestTakenOverReadRecordsNoObservation(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(d *Deps) {
		d.LeaseTTL = time.Hour
		d.RecoveryInterval = time.Hour // no recovery joins in
	})
	h.adapter.setRespond(func(in *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
		// Another replica takes the request over while the server reads.
		takeOver(t, h.server)
		return okRetrieval(in)
	})
	cat := h.start(t, "source_review", false).GetCatalogue()
	_, err := h.submit(t, cat.GetTaskId(), "call_1", capRetrieveAuthorizedSource,
		map[string]any{"source": handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())})
	wantErr(t, err, codes.Aborted, reasonLeaseLost)
	if obs := h.evidence.observationsOf(cat.GetTaskId()); len(obs) != 0 {
		t.Errorf("the replica that lost the request recorded %d observations; want none", len(obs))
	}
	r := requestOfCall(t, h, cat.GetTaskId(), "call_1")
	if a := openAttempt(r); a == nil || a.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED || len(r.GetExcerpts()) != 0 {
		t.Errorf("request = %v; want its attempt left open at PREPARED for the new owner", r)
	}
}

// A read whose result this replica cannot hold (its held results fill
// their budget) while evidence stays down is read again by recovery
// within the capability's retry rule, not on every pass: the request
// ends failed, INTERRUPTED, after its automatic retry, instead of
// calling the server (and charging its response) every few seconds for
// as long as the outage lasts.
func TestUnheldReadIsNotReadAgainOnEveryPass(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(d *Deps) { d.RecoveryInterval = 20 * time.Millisecond })
	h.server.unrecorded.mu.Lock()
	h.server.unrecorded.limit = 1 // no result fits
	h.server.unrecorded.mu.Unlock()
	h.evidence.mu.Lock()
	h.evidence.down = true
	h.evidence.mu.Unlock()
	cat := h.start(t, "source_review", false).GetCatalogue()
	_, err := h.submit(t, cat.GetTaskId(), "call_1", capRetrieveAuthorizedSource,
		map[string]any{"source": handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())})
	wantErr(t, err, codes.Unavailable, codeObservationNotRecorded)
	id := requestOfCall(t, h, cat.GetTaskId(), "call_1").GetId()
	var r *orchestratorv1.ToolRequest
	testkit.Eventually(t, "the request settled", func() bool {
		var err error
		if r, err = h.client.GetRequest(t.Context(), &orchestratorv1.GetRequestRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
		return settled(r)
	})
	if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_FAILED || r.GetOutcome() != adapterv1.Outcome_OUTCOME_INTERRUPTED ||
		len(r.GetAttempts()) != 1+maxAutomaticRetries {
		t.Errorf("request = %v; want FAILED, INTERRUPTED, after %d attempts", r, 1+maxAutomaticRetries)
	}
	if n := h.adapter.calls.Load(); n != 1+maxAutomaticRetries {
		t.Errorf("the server was called %d times, want %d", n, 1+maxAutomaticRetries)
	}
}

// A replica that closes (a rolling update) lets go of the requests whose
// results it held: they die with it, so their leases are released and
// another replica recovers them at once, not after the lease ttl.
func TestClosingReplicaReleasesItsHeldResults(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(d *Deps) {
		d.LeaseTTL = time.Hour // a lease left held would outlast the test
		d.RecoveryInterval = 20 * time.Millisecond
	})
	h.evidence.mu.Lock()
	h.evidence.down = true
	h.evidence.mu.Unlock()
	cat := h.start(t, "source_review", false).GetCatalogue()
	_, err := h.submit(t, cat.GetTaskId(), "call_1", capRetrieveAuthorizedSource,
		map[string]any{"source": handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())})
	wantErr(t, err, codes.Unavailable, codeObservationNotRecorded)
	id := requestOfCall(t, h, cat.GetTaskId(), "call_1").GetId()
	h.server.Close()
	h.evidence.mu.Lock()
	h.evidence.down = false
	h.evidence.mu.Unlock()

	next := NewServer(h.server.st, h.server.deps, nil)
	t.Cleanup(next.Close)
	var r *orchestratorv1.ToolRequest
	testkit.Eventually(t, "the request recovered by the next replica", func() bool {
		if r, err = next.st.GetRequest(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		return settled(r)
	})
	if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Errorf("request = %v; want EXECUTED by the next replica", r)
	}
}
