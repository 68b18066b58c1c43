package orchestrator

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/internal/apierror"
	"github.com/v0m3/v0m3/services/internal/provenance"
)

// A read whose result arrived but whose observation evidence could not
// record (evidence unavailable, or it stored the observation and stopped
// before answering) is not failed: the read happened. Its attempt stays
// open at the stage it reached, marked OBSERVATION_NOT_RECORDED, and the
// request waits (see awaitsObservation). Recovery finishes it once
// evidence is back: from the result this replica still holds in memory,
// recording it again under the same idempotency keys (so what evidence
// stored before it stopped is not stored twice) and committing; or, when
// the result is not held any more (the orchestrator restarted, another
// replica recovers it, or it did not fit in maxUnrecordedBytes), by the
// capability's retry rule as any interrupted attempt: a retrieval is read
// again.

// maxUnrecordedBytes bounds the results one replica holds for recording:
// during a long evidence outage the rest are read again once it is back.
const maxUnrecordedBytes = 64 << 20

// unrecordedResult is a result held until its observation is recorded.
type unrecordedResult struct {
	requestID string
	p         *prepared
	remote    *structpb.Struct
	resp      *adapterv1.ExecuteResponse
	size      int
	held      time.Time
}

// unrecordedResults are the held results of this replica, by attempt id.
type unrecordedResults struct {
	mu    sync.Mutex
	bytes int
	by    map[string]*unrecordedResult
}

// hold keeps r for attempt attemptID when it fits; it reports whether it
// was kept.
func (u *unrecordedResults) hold(attemptID string, r *unrecordedResult) bool {
	r.size = proto.Size(r.resp) + proto.Size(r.remote)
	u.mu.Lock()
	defer u.mu.Unlock()
	if prev, ok := u.by[attemptID]; ok {
		u.bytes -= prev.size
	}
	if u.bytes+r.size > maxUnrecordedBytes {
		delete(u.by, attemptID)
		return false
	}
	if u.by == nil {
		u.by = map[string]*unrecordedResult{}
	}
	u.by[attemptID] = r
	u.bytes += r.size
	return true
}

// get returns the result held for attemptID, or nil.
func (u *unrecordedResults) get(attemptID string) *unrecordedResult {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.by[attemptID]
}

// drop forgets the result held for attemptID.
func (u *unrecordedResults) drop(attemptID string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if r, ok := u.by[attemptID]; ok {
		u.bytes -= r.size
		delete(u.by, attemptID)
	}
}

// forget drops the results of requests that are no longer unsettled
// (another replica finished them): those held before listedAt whose
// request is not among listed.
func (u *unrecordedResults) forget(listed []*orchestratorv1.ToolRequest, listedAt time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.by) == 0 {
		return
	}
	keep := make(map[string]bool, len(listed))
	for _, r := range listed {
		keep[r.GetId()] = true
	}
	for id, r := range u.by {
		if !keep[r.requestID] && r.held.Before(listedAt) {
			u.bytes -= r.size
			delete(u.by, id)
		}
	}
}

// awaitsObservation reports whether att is a successful read waiting for
// its observation to be recorded.
func awaitsObservation(att *orchestratorv1.Attempt) bool {
	return att.GetEndTime() == nil && att.GetOutcome() == adapterv1.Outcome_OUTCOME_OK &&
		att.GetError().GetSafeCode() == codeObservationNotRecorded
}

// outage reports whether err says a dependency could not be reached or
// did not answer in time: what failed may pass once it is back.
func outage(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Canceled:
		return true
	}
	return false
}

// recordResult turns a successful observed attempt's result into
// observations and commits the request (see observe). When evidence cannot
// record it now, the request waits with its attempt open (see
// awaitObservation) and the caller gets UNAVAILABLE; any other refusal
// fails the request, saying the result did not become evidence.
func (s *Server) recordResult(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt,
	r *unrecordedResult) (*orchestratorv1.ToolRequest, error) {
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
		if outage(err) {
			return s.awaitObservation(ctx, task, req, att, r, err)
		}
		// The remote call completed but its result will not become
		// evidence: not committed, and said so.
		s.unrecorded.drop(att.GetId())
		att.Error = &adapterv1.ErrorEvidence{SafeCode: codeObservationNotRecorded}
		return s.fail(ctx, req, att)
	}
	keep()
	if awaitsObservation(att) {
		att.Error = nil
		att.Resolution = joinResolution(att.GetResolution(), "observation recorded once evidence was back")
	}
	s.unrecorded.drop(att.GetId())
	if err := s.failAt(ctx, FailPointAttemptObserved); err != nil {
		return nil, err
	}
	return s.commit(ctx, task, req, att, obs, nil)
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
			"the read happened; evidence could not record its observation (unavailable); waiting to record it once evidence is back")
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
	r.requestID, r.held = req.GetId(), s.now()
	if !s.unrecorded.hold(att.GetId(), r) {
		s.log.WarnContext(ctx, "result too large to hold until evidence is back; recovery reads again", "request", req.GetId(), "attempt", att.GetId())
	}
	return nil, apierror.Unavailable(codeObservationNotRecorded,
		fmt.Sprintf("request %s: the read happened but evidence could not record its observation (%s); the request waits and completes once evidence is back (follow it with GetRequest or WatchTask)",
			req.GetId(), codeName(status.Code(cause))),
		map[string]string{"request_id": req.GetId(), "attempt_id": att.GetId()})
}

// recoverUnrecorded finishes a read awaiting its observation whose result
// this replica holds; it reports false when it holds none (the attempt is
// then recovered as any interrupted one).
func (s *Server) recoverUnrecorded(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt) (bool, error) {
	if !awaitsObservation(att) {
		return false, nil
	}
	r := s.unrecorded.get(att.GetId())
	if r == nil {
		return false, nil
	}
	_, err := s.recordResult(ctx, task, req, att, r)
	return true, ignoreRefusal(err)
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
