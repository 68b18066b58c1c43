// Package review holds the one rule every service applies before it uses
// a connection: nothing is started and nothing is sent to a server whose
// connection a reviewer has not approved at its current configuration.
// The registry decides the review state (a new connection, and a config
// revision that changes what runs or is reached, are pending); the adapter
// checks it here before it starts or contacts anything.
package review

import (
	"fmt"
	"strconv"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Reason is the ErrorInfo reason of a refusal to use an unreviewed
// connection.
const Reason = "CONNECTION_NOT_REVIEWED"

// Approved returns nil when c's review state is APPROVED, else
// FAILED_PRECONDITION CONNECTION_NOT_REVIEWED saying what a person must do.
func Approved(c *registryv1.Connection) error {
	var msg string
	switch c.GetReviewState() {
	case registryv1.ReviewState_REVIEW_STATE_APPROVED:
		return nil
	case registryv1.ReviewState_REVIEW_STATE_REJECTED:
		msg = fmt.Sprintf("connection %s was rejected in review by %s at config revision %d; nothing is started or contacted. Change its configuration to propose a new revision for review",
			c.GetId(), c.GetReviewedBy(), c.GetReviewedConfigRevision())
	default:
		msg = fmt.Sprintf("connection %s is pending review at config revision %d (proposed by %s); nothing is started or contacted until a reviewer approves it (RegistryService/ReviewConnection)",
			c.GetId(), c.GetConfigRevision(), c.GetProposedBy())
	}
	return apierror.New(codes.FailedPrecondition, Reason, msg, map[string]string{
		"connection_id":   c.GetId(),
		"config_revision": strconv.FormatInt(c.GetConfigRevision(), 10),
		"review_state":    c.GetReviewState().String(),
	})
}
