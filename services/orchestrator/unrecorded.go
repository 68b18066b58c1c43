package orchestrator

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/provenance"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// A read whose result arrived but whose response policy could not charge
// or whose observation evidence could not record (unavailable, or evidence
// stored the observation and stopped before answering) is not failed: the
// read happened. Its attempt stays
// open at the stage it reached, marked OBSERVATION_NOT_RECORDED, and the
// request waits (see awaitsObservation). The replica holds the result in
// memory and keeps the request's lease, so no other replica reads it
// again, and records it on every recovery pass until evidence takes it,
// under the same idempotency keys (what evidence stored before it stopped
// is not stored twice), then commits. When the result is not held (the
// replica stopped, or it did not fit in maxUnrecordedBytes) another
// replica, or the restarted one, recovers the attempt by the capability's
// retry rule as any interrupted one: a retrieval is read again.

// maxUnrecordedBytes bounds the results one replica holds for recording:
// during a long evidence outage the rest are read again once it is back.
const maxUnrecordedBytes = 64 << 20

// unrecordedResult is a result held until its observation is recorded.
type unrecordedResult struct {
	requestID, attemptID string
	p                    *prepared
	remote               *structpb.Struct
	resp                 *adapterv1.ExecuteResponse
	size                 int
	// lease is the request's lease, kept while the result is held.
	lease *lease
}

// unrecordedResults are the held results of this replica, by request id.
type unrecordedResults struct {
	mu    sync.Mutex
	bytes int
	by    map[string]*unrecordedResult
	// limit bounds bytes; 0 is maxUnrecordedBytes.
	limit int
}

// hold keeps r when it fits; it reports whether it was kept.
func (u *unrecordedResults) hold(r *unrecordedResult) bool {
	r.size = proto.Size(r.resp) + proto.Size(r.remote)
	u.mu.Lock()
	defer u.mu.Unlock()
	limit := u.limit
	if limit == 0 {
		limit = maxUnrecordedBytes
	}
	if u.bytes+r.size > limit {
		return false
	}
	if u.by == nil {
		u.by = map[string]*unrecordedResult{}
	}
	u.by[r.requestID] = r
	u.bytes += r.size
	return true
}

// held returns the results held, in no order.
func (u *unrecordedResults) held() []*unrecordedResult {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]*unrecordedResult, 0, len(u.by))
	for _, r := range u.by {
		out = append(out, r)
	}
	return out
}

// drop forgets the result held for a request, if any, and ends the
// request's lease it kept.
func (u *unrecordedResults) drop(requestID string) {
	u.mu.Lock()
	r, ok := u.by[requestID]
	if ok {
		u.bytes -= r.size
		delete(u.by, requestID)
	}
	u.mu.Unlock()
	if ok && r.lease != nil {
		r.lease.end()
	}
}

// awaitsObservation reports whether att is a successful read waiting for
// its observation to be recorded.
func awaitsObservation(att *orchestratorv1.Attempt) bool {
	return att.GetEndTime() == nil && att.GetOutcome() == adapterv1.Outcome_OUTCOME_OK &&
		att.GetError().GetSafeCode() == codeObservationNotRecorded
}

// recordResult turns a successful observed attempt's result into
// observations and commits the request (see observe). When evidence cannot
// record it now, the request waits with its attempt open (see
// awaitObservation) and the caller gets UNAVAILABLE; any other refusal
// fails the request, saying the result did not become evidence.
func (s *Server) recordResult(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt,
	r *unrecordedResult) (*orchestratorv1.ToolRequest, error) {
	// The response's charge is keyed by the attempt, so a wait repeats
	// it safely. Policy unavailable is no more a verdict than evidence
	// unavailable: the read waits for both.
	if err := s.chargeResponse(ctx, task, att, r.resp); err != nil {
		if transient(err) {
			s.log.WarnContext(ctx, "charge response bytes", "request", req.GetId(), "attempt", att.GetId(), "err", err)
			return s.awaitObservation(ctx, task, req, att, r, err)
		}
		defer s.unrecorded.drop(req.GetId())
		return s.withholdOverBudget(ctx, req, att, err)
	}
	observe := s.observe
	if provenance.ResultKind(r.p.capability) == registryv1.ResultKind_RESULT_KIND_DATA {
		observe = s.observeData
	}
	// What recording traces is kept only if it all succeeds: a retry
	// traces it again.
	octx, keep := provisional(ctx)
	obs, err := observe(octx, task, req, att, r.p, r.remote, r.resp)
	if err != nil {
		s.log.WarnContext(ctx, "record observation", "request", req.GetId(), "attempt", att.GetId(), "err", err)
		if transient(err) {
			return s.awaitObservation(ctx, task, req, att, r, err)
		}
		// The remote call completed but its result will not become
		// evidence: not committed, and said so.
		att.Error = &adapterv1.ErrorEvidence{SafeCode: codeObservationNotRecorded}
		defer s.unrecorded.drop(req.GetId())
		return s.fail(ctx, req, att)
	}
	keep()
	if awaitsObservation(att) {
		att.Error = nil
		att.Resolution = joinResolution(att.GetResolution(), "observation recorded once evidence was back")
	}
	if err := s.failAt(ctx, FailPointAttemptObserved); err != nil {
		return nil, err
	}
	out, err := s.commit(ctx, task, req, att, obs, nil)
	if err == nil {
		s.unrecorded.drop(req.GetId())
	}
	return out, err
}

// awaitObservation leaves a read whose observation evidence could not
// record waiting, its attempt open, with the result held for recovery
// when it fits, and tells the caller: UNAVAILABLE, the request id, and
// that the request completes once evidence is back.
func (s *Server) awaitObservation(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt,
	r *unrecordedResult, cause error) (*orchestratorv1.ToolRequest, error) {
	if !awaitsObservation(att) {
		att.Error = &adapterv1.ErrorEvidence{SafeCode: codeObservationNotRecorded}
		att.Resolution = joinResolution(att.GetResolution(),
			"the read happened; its response could not be charged or its observation recorded (a dependency is unavailable); waiting to record it once it is back")
		detail := fmt.Sprintf("attempt %d read %s; waiting for evidence to record its observation", att.GetNumber(), req.GetCapability())
		if _, err := s.updateRequest(ctx, req.GetId(), func(q *orchestratorv1.ToolRequest) error {
			mergeAttempt(q, att)
			q.UpdateTime = s.timestamp()
			return nil
		}, func(ctx context.Context) {
			s.emit(ctx, task.GetId(), req.GetId(), "request.awaiting_evidence", detail)
		}); err != nil {
			// The attempt stays open at its last persisted stage:
			// recovery finds it either way.
			s.log.ErrorContext(ctx, "persist the read awaiting its observation", "request", req.GetId(), "attempt", att.GetId(), "err", err)
		}
	}
	if r.lease == nil {
		// Held from now on, with the request's lease: the calls that
		// hold the lease leave it held.
		r.requestID, r.attemptID, r.lease = req.GetId(), att.GetId(), leaseOf(ctx)
		if r.lease != nil && s.unrecorded.hold(r) {
			r.lease.keep()
		} else {
			s.log.WarnContext(ctx, "result not held until evidence is back; recovery reads again", "request", req.GetId(), "attempt", att.GetId())
		}
	}
	return nil, apierror.Unavailable(codeObservationNotRecorded,
		fmt.Sprintf("request %s: the read happened but its result could not be recorded yet (%s); the request waits and completes once the dependency is back (follow it with GetRequest or WatchTask)",
			req.GetId(), codeName(status.Code(cause))),
		map[string]string{"request_id": req.GetId(), "attempt_id": att.GetId()})
}

// recordHeldResults tries once more to record each result this replica
// holds, a few at a time, under the request's kept lease.
func (s *Server) recordHeldResults(ctx context.Context) {
	recoverEach(ctx, s.unrecorded.held(), func(r *unrecordedResult) { s.recordHeld(ctx, r) })
}

// recordHeld records a held result and commits its request, or leaves it
// held while evidence cannot take it. A request that is no longer waiting
// for it, or whose lease was lost, is let go.
func (s *Server) recordHeld(ctx context.Context, r *unrecordedResult) {
	ctx, cancel := context.WithTimeout(withLease(ctx, r.lease), s.workTimeout)
	defer cancel()
	if err := stillOwner(ctx); err != nil {
		s.unrecorded.drop(r.requestID)
		return
	}
	ctx = withCheckpoint(ctx)
	defer s.flush(ctx)
	req, err := s.st.GetRequest(ctx, r.requestID)
	if err != nil {
		s.log.WarnContext(ctx, "load the request of a held result", "request", r.requestID, "err", err)
		return
	}
	att := openAttempt(req)
	if att.GetId() != r.attemptID || !awaitsObservation(att) {
		s.unrecorded.drop(r.requestID)
		return
	}
	task, err := s.st.GetTask(ctx, req.GetTaskId())
	if err != nil {
		s.log.WarnContext(ctx, "load the task of a held result", "request", r.requestID, "err", err)
		return
	}
	if _, err := s.recordResult(ctx, task, req, att, r); err != nil && !transient(err) {
		s.log.ErrorContext(ctx, "record a held result", "request", r.requestID, "err", err)
	}
}

// provisional returns ctx with a checkpoint of its own, whose trace and
// task events keep moves to ctx's checkpoint; unless kept they are
// dropped. Without a checkpoint in ctx, ctx is returned as it is.
func provisional(ctx context.Context) (context.Context, func()) {
	parent := checkpointOf(ctx)
	if parent == nil {
		return ctx, func() {}
	}
	c := &checkpoint{}
	return context.WithValue(ctx, checkpointKey{}, c), func() {
		c.mu.Lock()
		traces, events := c.traces, c.events
		c.traces, c.events = nil, nil
		c.mu.Unlock()
		parent.mu.Lock()
		parent.traces = append(parent.traces, traces...)
		parent.events = append(parent.events, events...)
		parent.mu.Unlock()
	}
}
