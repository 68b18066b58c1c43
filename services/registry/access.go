package registry

import (
	"context"

	"github.com/v0m3/v0m3/internal/authz"
)

// WithAuthorizer sets who decides callers' administrative actions (the
// policy service). Without one, every action of a person or product
// service is refused; peer services the access table admits are not
// asked.
func (s *Server) WithAuthorizer(d authz.Decider) *Server {
	s.authz = d
	return s
}

// requireRead checks that the caller may read a registry record: reads
// are authorized by policy like writes (a caller in no group sees
// nothing), so a connection's command, arguments, environment and
// credential reference are not free reconnaissance. Peer services the
// access table admits are not asked.
func (s *Server) requireRead(ctx context.Context, action, resType, resID string) error {
	_, err := s.authz.Require(ctx, action, authz.Resource{Type: resType, ID: resID}, nil)
	return err
}
