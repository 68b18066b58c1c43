package evidence

import (
	"context"
	"time"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// Prune applies trace retention now (see PruneOlderThan). Only trace
// protocol events change; observations (cited by a claim or not),
// revisions, claim links, receipts and assets are never pruned.
func (s *Server) Prune(ctx context.Context, req *evidencev1.PruneRequest) (*evidencev1.PruneResponse, error) {
	if err := s.require(ctx, authz.EvidencePrune, "evidence", ""); err != nil {
		return nil, err
	}
	d := req.GetOlderThan()
	if d == nil || d.CheckValid() != nil || d.AsDuration() < 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "older_than is required and must not be negative",
			apierror.FieldViolation{Field: "older_than", Description: "required, >= 0"})
	}
	n, err := s.PruneOlderThan(ctx, d.AsDuration())
	if err != nil {
		return nil, s.storeError(ctx, err, "prune", "", "", nil)
	}
	return &evidencev1.PruneResponse{SummarizedEvents: int32(n)}, nil
}

// RunRetention prunes traces older than age every interval until ctx ends.
// It returns at once when age or interval is not positive (retention off).
// A failed run is logged and retried at the next tick.
func (s *Server) RunRetention(ctx context.Context, age, interval time.Duration) {
	if age <= 0 || interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := s.PruneOlderThan(ctx, age); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "retention run failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
