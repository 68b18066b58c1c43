package orchestrator

import "github.com/v0m3/v0m3/internal/bounds"

// limits bound every field of a request to the product API
// (bounds.UnaryServer and bounds.StreamServer apply them before a handler
// runs, so a new RPC is bounded too); identifiers, digests and ids
// (task_id, provider_call_id, document_digest) take bounds.ID, free text
// (purpose, reason, note, page_token) bounds.Text, arguments
// bounds.Structured and each scope bounds.Entries (SCOPE_TOO_LARGE), unless
// named here.
var limits = bounds.Limits{
	Bytes: map[string]int{
		"profile": bounds.Name, "capability": bounds.Name, "requester": bounds.Name, "groups": bounds.Name,
		"title": bounds.Name, "uri": bounds.URI,
	},
}

// Limits are the bounds of a request to the orchestrator (see
// bounds.Bounded).
func (s *Server) Limits() bounds.Limits { return limits }

// The server declares its limits, so serve.New bounds every request.
var _ bounds.Bounded = (*Server)(nil)

// maxEchoBytes bounds caller text quoted back in an error message.
const maxEchoBytes = bounds.Echo
