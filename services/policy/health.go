package policy

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// maxHealthDetail bounds the detail an adapter may attach to a report.
const maxHealthDetail = 1024

// ReportConnectionHealth records the adapter's latest view of a connection.
// Eligible stops offering capabilities of a connection reported degraded.
func (s *Server) ReportConnectionHealth(ctx context.Context, req *policyv1.ReportConnectionHealthRequest) (*policyv1.ConnectionHealth, error) {
	var bad []apierror.FieldViolation
	if req.GetConnectionId() == "" {
		bad = append(bad, apierror.FieldViolation{Field: "connection_id", Description: "required"})
	}
	switch req.GetState() {
	case policyv1.HealthState_HEALTH_STATE_HEALTHY, policyv1.HealthState_HEALTH_STATE_DEGRADED:
	default:
		bad = append(bad, apierror.FieldViolation{Field: "state", Description: "must be HEALTHY or DEGRADED"})
	}
	if len(req.GetDetail()) > maxHealthDetail {
		bad = append(bad, apierror.FieldViolation{Field: "detail", Description: fmt.Sprintf("at most %d bytes", maxHealthDetail)})
	}
	if len(bad) > 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "the health report is invalid", bad...)
	}
	h := &policyv1.ConnectionHealth{
		ConnectionId: req.GetConnectionId(),
		State:        req.GetState(),
		Detail:       req.GetDetail(),
		ReportTime:   timestamppb.New(s.now()),
	}
	if err := s.store.PutHealth(ctx, h); err != nil {
		return nil, s.storeError(ctx, err, "record the connection's health")
	}
	s.log.InfoContext(ctx, "connection health reported", "connection_id", h.GetConnectionId(), "state", h.GetState().String())
	return h, nil
}
