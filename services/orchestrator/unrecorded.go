package orchestrator

import (
	"context"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
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
		r.lease.End()
	}
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
