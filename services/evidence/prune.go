package evidence

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// PruneOlderThan applies trace retention: every protocol event older than olderThan
// is replaced by a sanitized summary that keeps what identifies the call
// and its result (connection, snapshot, request, method, duration, response
// digest and size, outcome, safe error code) and drops the safe arguments
// and the untrusted error detail. Product events, observations, revisions,
// claim links and receipts are never touched. It returns how many events
// changed; pruning again changes nothing.
func (s *Server) PruneOlderThan(ctx context.Context, olderThan time.Duration) (int, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("evidence: prune: negative age %v", olderThan)
	}
	cutoff := s.now().Add(-olderThan)
	n, err := s.st.RewriteTrace(ctx, cutoff, summarizeProtocol)
	if err != nil {
		return 0, fmt.Errorf("evidence: prune: %w", err)
	}
	s.log.InfoContext(ctx, "trace pruned", "cutoff", cutoff, "events", n)
	return n, nil
}

// summarizeProtocol replaces a protocol event's body with its sanitized
// summary and reports whether anything was dropped.
func summarizeProtocol(ev *evidencev1.TraceEvent) bool {
	p := ev.GetProtocol()
	if p == nil {
		return false
	}
	sum := &evidencev1.ProtocolEvent{
		ConnectionId:   p.GetConnectionId(),
		SnapshotId:     p.GetSnapshotId(),
		RequestId:      p.GetRequestId(),
		Method:         p.GetMethod(),
		Duration:       p.GetDuration(),
		ResponseDigest: p.GetResponseDigest(),
		ResponseBytes:  p.GetResponseBytes(),
		Outcome:        p.GetOutcome(),
	}
	if e := p.GetError(); e != nil {
		sum.Error = &evidencev1.ErrorEvidence{SafeCode: e.GetSafeCode()}
	}
	if proto.Equal(p, sum) {
		return false
	}
	ev.Layer = &evidencev1.TraceEvent_Protocol{Protocol: sum}
	return true
}
