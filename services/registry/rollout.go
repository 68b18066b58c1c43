package registry

import (
	"context"
	"fmt"
	"strconv"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Reasons of ReportRollout refusals.
const (
	// ReasonRevisionNotLatest: the reported revision is not the
	// connection's latest config revision (older reports are stale, newer
	// ones do not exist).
	ReasonRevisionNotLatest = "CONFIG_REVISION_NOT_LATEST"
	// ReasonNotApproved: a revision whose configuration waits for (or
	// failed) review never serves.
	ReasonNotApproved = "CONNECTION_NOT_APPROVED"
)

// maxRolloutDetail bounds the stored failure detail: it is an installer's
// summary, not a log.
const maxRolloutDetail = 1024

// ReportRollout records whether the workload of a connection's latest
// config revision rolled out. Ready makes that revision the serving one
// (calls execute at it and approvals bind to it from then on); not ready
// records the failure and leaves the previous revision serving. Reporting
// what is already recorded changes nothing, so the operator may repeat it.
func (s *Server) ReportRollout(ctx context.Context, req *registryv1.ReportRolloutRequest) (*registryv1.Connection, error) {
	who, err := s.authz.Require(ctx, authz.ConnectionUpdate, authz.Resource{Type: "connection", ID: req.GetId()}, nil)
	if err != nil {
		return nil, err
	}
	var v []apierror.FieldViolation
	if req.GetId() == "" {
		v = append(v, apierror.FieldViolation{Field: "id", Description: "the connection id is required"})
	}
	if req.GetConfigRevision() <= 0 {
		v = append(v, apierror.FieldViolation{Field: "config_revision", Description: "the config revision that rolled out (>= 1) is required"})
	}
	if !req.GetReady() && req.GetDetail() == "" {
		v = append(v, apierror.FieldViolation{Field: "detail", Description: "say why the rollout failed"})
	}
	if len(v) > 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "invalid rollout report: "+violationText(v), v...)
	}
	// The operator never reads a Secret's data, so its detail holds none.
	detail := req.GetDetail()
	if len(detail) > maxRolloutDetail {
		detail = detail[:maxRolloutDetail] + "…"
	}

	var out *registryv1.Connection
	var changed bool
	err = s.updateConnection(ctx, req.GetId(), func(u *ConnectionUpdate) error {
		changed = false
		c := u.Connection
		out = c
		rev := req.GetConfigRevision()
		switch {
		case c.GetState() == registryv1.ConnectionState_CONNECTION_STATE_RETIRED:
			return connectionRetired(c)
		case rev != c.GetConfigRevision():
			return apierror.New(codes.FailedPrecondition, ReasonRevisionNotLatest,
				fmt.Sprintf("connection %s is at config revision %d, not %d; report the rollout of the latest revision", c.GetId(), c.GetConfigRevision(), rev),
				map[string]string{"connection_id": c.GetId(), "config_revision": strconv.FormatInt(c.GetConfigRevision(), 10)})
		case req.GetReady() && c.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_APPROVED:
			return apierror.New(codes.FailedPrecondition, ReasonNotApproved,
				fmt.Sprintf("connection %s is %s at config revision %d; only an approved configuration serves", c.GetId(), c.GetReviewState(), rev),
				map[string]string{"connection_id": c.GetId(), "review_state": c.GetReviewState().String()})
		case req.GetReady() && c.GetServingConfigRevision() == rev:
			return nil
		case !req.GetReady() && c.GetRolloutFailure().GetConfigRevision() == rev && c.GetRolloutFailure().GetDetail() == detail:
			return nil
		}
		now := s.timestamp()
		changed = true
		c.UpdateTime = now
		if req.GetReady() {
			from := c.GetServingConfigRevision()
			c.ServingConfigRevision = rev
			c.RolloutFailure = nil
			u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_SERVING_REVISION_CHANGED, c.GetId(), "", "",
				fmt.Sprintf("config revision %d serves (its workload rolled out, reported by %s); it replaced revision %d", rev, actor(who), from)))
			return nil
		}
		c.RolloutFailure = &registryv1.RolloutFailure{ConfigRevision: rev, Detail: detail, ReportTime: now}
		u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_ROLLOUT_FAILED, c.GetId(), "", "",
			fmt.Sprintf("config revision %d did not roll out (%s, reported by %s); revision %d keeps serving", rev, detail, actor(who), c.GetServingConfigRevision())))
		return nil
	})
	if err != nil {
		return nil, err
	}
	if changed {
		s.log.InfoContext(ctx, "rollout reported", "connection_id", out.GetId(), "config_revision", req.GetConfigRevision(),
			"ready", req.GetReady(), "serving_config_revision", out.GetServingConfigRevision(), "by", actor(who))
	}
	return out, nil
}
