package evidence

import (
	"context"

	"google.golang.org/grpc"

	"github.com/v0m3/v0m3/internal/identity"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// SelfAudit appends the audit records of this service's own privileged
// RPCs (Prune, LinkClaim) to its own log, in process: the evidence
// service is no peer of itself, and its erasures must be on record like
// every other service's actions. Records name the evidence service as
// recorded_by.
type SelfAudit struct{ s *Server }

// SelfAudit returns the in-process appender for audit.New.
func (s *Server) SelfAudit() SelfAudit { return SelfAudit{s: s} }

// AppendAuditRecord appends as the evidence service.
func (a SelfAudit) AppendAuditRecord(ctx context.Context, in *evidencev1.AppendAuditRecordRequest, _ ...grpc.CallOption) (*evidencev1.AuditRecord, error) {
	ctx = identity.WithCaller(ctx, identity.Caller{ID: identity.Evidence, Kind: identity.KindService})
	return a.s.AppendAuditRecord(ctx, in)
}
