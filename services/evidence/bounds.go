package evidence

import (
	"github.com/v0m3/v0m3/internal/bounds"
	"github.com/v0m3/v0m3/internal/serve"
)

// limits bound every field of a request to evidence (bounds.UnaryServer
// applies them before a handler runs); identifiers and digests take
// bounds.ID and other text bounds.Text unless named here. Trace details
// and attestations are written by peer services and may be longer than
// what a person writes; an asset's content is bounded by the largest
// message a V0M3 hop carries.
var limits = bounds.Limits{
	Bytes: map[string]int{
		"media_type": bounds.Name, "method": bounds.Name, "outcome": bounds.Name, "safe_code": bounds.Name,
		"capability": bounds.Name, "server_name": bounds.Name, "server_version": bounds.Name,
		"requester": bounds.Name, "actor": bounds.Name,
		"resource_uri": bounds.URI,
		"detail":       bounds.Long, "untrusted_detail": bounds.Long, "adapter_detail": bounds.Long,
		"policy_decision": bounds.Long, "attestation": bounds.Long,
		// Each value of an observation's revision metadata, which a
		// server reported.
		"revision_metadata": bounds.Long,
		// The remote arguments of a call: product arguments (at most
		// bounds.Structured) with mapping defaults and resolved targets.
		"safe_arguments":  4 * bounds.Structured,
		"idempotency_key": maxIdempotencyKeyBytes,
		"principal":       maxAuditField, "action": maxAuditField, "resource": maxAuditField, "revision": maxAuditField,
		"content": serve.MaxMessageBytes,
		// A candidate observation is validated with its whole text, so
		// that evidence can say it must be an asset; what one record may
		// quote inline is the handler's bound (WithMaxInlineBytes).
		"text": serve.MaxMessageBytes,
	},
	// Passages are as many as the text has paragraphs: bounded by the
	// message, as each takes more than 8 bytes encoded.
	Entries: map[string]int{"events": maxAppendTraces, "passages": serve.MaxMessageBytes / 8},
}

// Limits are the bounds of a request to evidence (see bounds.Bounded).
func (s *Server) Limits() bounds.Limits { return limits }

// The server declares its limits, so serve.New bounds every request.
var _ bounds.Bounded = (*Server)(nil)
