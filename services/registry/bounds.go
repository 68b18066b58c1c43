package registry

import "github.com/v0m3/v0m3/internal/bounds"

// limits bound every field of a request to the registry
// (bounds.UnaryServer applies them before a handler runs); identifiers
// and digests take bounds.ID and other text bounds.Text unless named
// here. What a server described (descriptions, icons) may be longer than
// what a person writes; a snapshot may list many tools and resources.
var limits = bounds.Limits{
	Bytes: map[string]int{
		"name": bounds.Name, "display_name": bounds.Name, "owner": bounds.Name, "version": bounds.Name,
		"protocol_version": bounds.Name, "adapter": bounds.Name, "credential_version": bounds.Name,
		"mime_type": bounds.Name, "sizes": bounds.Name, "theme": bounds.Name, "capability": bounds.Name,
		"field": bounds.Name, "refers_to": bounds.Name, "allowed_media_types": bounds.Name, "created_by": bounds.Name,
		"managed_by": bounds.Name, "remote_field": bounds.Name, "product_field": bounds.Name,
		"idempotency_key_field": bounds.Name, "status_tool": bounds.Name, "handle_field": bounds.Name,
		"resource_limits": bounds.Name,
		"command":         bounds.URI, "args": bounds.URI, "url": bounds.URI, "uri": bounds.URI, "uri_template": bounds.URI,
		"working_dir": bounds.URI, "credential_ref": bounds.URI, "uri_pointer": bounds.URI,
		// Image references name a repository before the digest.
		"image_digest": bounds.URI, "workload_digest": bounds.URI,
		"description": bounds.Long, "src": bounds.Long,
		"detail": maxRolloutDetail,
	},
	Entries: map[string]int{
		"tools": 10 * bounds.Entries, "resources": 10 * bounds.Entries,
		"resource_templates": 10 * bounds.Entries, "prompts": 10 * bounds.Entries,
	},
}

// Limits are the bounds of a request to the registry (see bounds.Bounded).
func (s *Server) Limits() bounds.Limits { return limits }

// The server declares its limits, so serve.New bounds every request.
var _ bounds.Bounded = (*Server)(nil)
