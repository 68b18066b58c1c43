package registry

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// ReviewConnection approves or rejects a pending connection at its current
// config revision. The reviewer is the authenticated caller; policy decides
// who may review and refuses a reviewer who proposed the configuration
// (separation of duties). Until a connection is approved the adapter starts
// no process for it and sends it no request.
func (s *Server) ReviewConnection(ctx context.Context, req *registryv1.ReviewConnectionRequest) (*registryv1.Connection, error) {
	var v []apierror.FieldViolation
	if req.GetConnectionId() == "" {
		v = append(v, apierror.FieldViolation{Field: "connection_id", Description: "the connection to review is required"})
	}
	if req.GetConfigRevision() <= 0 {
		v = append(v, apierror.FieldViolation{Field: "config_revision", Description: "the config revision you reviewed (>= 1) is required"})
	}
	if len(v) > 0 {
		return nil, apierror.InvalidArgument("INVALID_REVIEW", "invalid review: "+violationText(v), v...)
	}
	cur, err := s.getConnection(ctx, req.GetConnectionId())
	if err != nil {
		return nil, err
	}
	// Separation of duties compares the reviewer with whoever proposed the
	// configuration under review; the transaction below checks that it is
	// still the one policy was asked about.
	reviewer, err := s.authz.Require(ctx, authz.ConnectionReview, authz.Resource{Type: "connection", ID: cur.GetId()},
		map[string]string{"proposed_by": cur.GetProposedBy(), "created_by": cur.GetCreatedBy(), "owner": cur.GetOwner()})
	if err != nil {
		return nil, err
	}
	var out *registryv1.Connection
	err = s.updateConnection(ctx, cur.GetId(), func(u *ConnectionUpdate) error {
		c := u.Connection
		if c.GetState() == registryv1.ConnectionState_CONNECTION_STATE_RETIRED {
			return connectionRetired(c)
		}
		if c.GetConfigRevision() != req.GetConfigRevision() || c.GetProposedBy() != cur.GetProposedBy() {
			return apierror.New(codes.Aborted, "CONFIG_REVISION_CONFLICT",
				fmt.Sprintf("connection %s is at config revision %d, not %d; review the current configuration", c.GetId(), c.GetConfigRevision(), req.GetConfigRevision()),
				map[string]string{"connection_id": c.GetId(), "config_revision": strconv.FormatInt(c.GetConfigRevision(), 10)})
		}
		if c.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_PENDING {
			return apierror.New(codes.FailedPrecondition, "CONNECTION_NOT_PENDING_REVIEW",
				fmt.Sprintf("connection %s at config revision %d was already reviewed (%s by %s); only a pending connection can be reviewed, and a change to what it runs or reaches makes it pending again",
					c.GetId(), c.GetConfigRevision(), reviewStateName(c.GetReviewState()), c.GetReviewedBy()),
				map[string]string{"connection_id": c.GetId(), "review_state": c.GetReviewState().String()})
		}
		now := s.timestamp()
		c.ReviewState = registryv1.ReviewState_REVIEW_STATE_REJECTED
		if req.GetApprove() {
			c.ReviewState = registryv1.ReviewState_REVIEW_STATE_APPROVED
		}
		c.ReviewedBy, c.ReviewNote, c.ReviewTime = actor(reviewer), req.GetNote(), now
		c.ReviewedConfigRevision = c.GetConfigRevision()
		c.UpdateTime = now
		u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONNECTION_REVIEWED, c.GetId(), "", "",
			fmt.Sprintf("config revision %d %s by %s (proposed by %s)", c.GetConfigRevision(), reviewStateName(c.GetReviewState()), c.GetReviewedBy(), c.GetProposedBy())))
		out = c
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.log.InfoContext(ctx, "connection reviewed", "connection_id", out.GetId(), "config_revision", out.GetConfigRevision(),
		"review_state", out.GetReviewState().String(), "reviewed_by", out.GetReviewedBy(), "proposed_by", out.GetProposedBy())
	return out, nil
}

// reviewStateName is a review state in words, e.g. "approved".
func reviewStateName(s registryv1.ReviewState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "REVIEW_STATE_"))
}
