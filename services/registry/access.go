package registry

import (
	"context"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/services/identity"
	"github.com/v0m3/v0m3/services/internal/apierror"
	"github.com/v0m3/v0m3/services/internal/authz"
)

// WithAuthorizer sets who decides callers' administrative actions (the
// policy service). Without one, every action of a person or product
// service is refused; peer services the access table admits are not
// asked.
func (s *Server) WithAuthorizer(d authz.Decider) *Server {
	s.authz = d
	return s
}

// require returns the caller when policy lets it take action on res.
func (s *Server) require(ctx context.Context, action string, res authz.Resource, attrs map[string]string) (identity.Caller, error) {
	if s.authz == nil {
		if c, ok := identity.CallerFrom(ctx); ok && c.Kind == identity.KindService {
			return c, nil
		}
		return identity.Caller{}, apierror.New(codes.FailedPrecondition, "AUTHORIZATION_NOT_CONFIGURED",
			"the registry has no policy service to decide administrative actions", nil)
	}
	return s.authz.Require(ctx, action, res, attrs)
}
