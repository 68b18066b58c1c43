package registry

import "github.com/v0m3/v0m3/services/internal/authz"

// WithAuthorizer sets who decides callers' administrative actions (the
// policy service). Without one, every action of a person or product
// service is refused; peer services the access table admits are not
// asked.
func (s *Server) WithAuthorizer(d authz.Decider) *Server {
	s.authz = d
	return s
}
