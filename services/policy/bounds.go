package policy

import "github.com/v0m3/v0m3/internal/bounds"

// limits bound every field of a request to policy (bounds.UnaryServer
// applies them before a handler runs); identifiers take bounds.ID and
// other text bounds.Text unless named here.
var limits = bounds.Limits{
	Bytes: map[string]int{
		"requester": bounds.Name, "groups": bounds.Name, "capability": bounds.Name, "needed_capabilities": bounds.Name,
		"action": bounds.Name, "resource_type": bounds.Name, "token": bounds.ID, "idempotency_key": bounds.ID,
		"resource": bounds.URI, "target": maxTargetBytes,
		"source_scope": maxTargetBytes, "artifact_scope": maxTargetBytes, "destination_scope": maxTargetBytes,
		"label": maxLabelBytes, "detail": maxHealthDetail,
	},
	Entries: map[string]int{
		"source_scope": maxScopeTargets, "artifact_scope": maxScopeTargets, "destination_scope": maxScopeTargets,
	},
}

// Limits are the bounds of a request to policy (see bounds.Bounded).
func (s *Server) Limits() bounds.Limits { return limits }

// The server declares its limits, so serve.New bounds every request.
var _ bounds.Bounded = (*Server)(nil)
