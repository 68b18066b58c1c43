package policy

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/handlekind"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/store"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// maxLabelBytes bounds a handle label: it goes into model context.
const maxLabelBytes = 512

// handleKey is the storage key of a token. Tokens are stored only as
// digests, so reading the database does not yield usable handles.
func handleKey(token string) string { return digest.Bytes([]byte(token)) }

// tokenLen is the length of a minted token: "h_" and 32 random bytes in
// unpadded base32 (52 characters).
const tokenLen = 2 + 52

// wellFormed reports whether token has the shape of a minted handle. A
// malformed token is refused before any lookup: whatever a model put in a
// handle field never reaches the store as a key.
func wellFormed(token string) bool {
	if len(token) != tokenLen || token[:2] != "h_" {
		return false
	}
	for i := 2; i < len(token); i++ {
		c := token[i]
		if (c < 'a' || c > 'z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}

// tokenPrefix is the only part of a presented token an error may echo.
func tokenPrefix(token string) string {
	return fmt.Sprintf("%q…", token[:min(len(token), 6)])
}

// MintHandle creates an opaque, short-lived handle for one target in the
// task's registered source scope, for the task's requester. The token is
// random: it carries nothing of the target, which stays server-side.
func (s *Server) MintHandle(ctx context.Context, req *policyv1.MintHandleRequest) (*policyv1.Handle, error) {
	var bad []apierror.FieldViolation
	for _, f := range []struct{ name, v string }{
		{"task_id", req.GetTaskId()}, {"requester", req.GetRequester()}, {"capability", req.GetCapability()},
		{"target", req.GetTarget()}, {"mapping_id", req.GetMappingId()},
	} {
		if f.v == "" {
			bad = append(bad, apierror.FieldViolation{Field: f.name, Description: "required"})
		}
	}
	if req.GetMappingRevision() <= 0 {
		bad = append(bad, apierror.FieldViolation{Field: "mapping_revision", Description: "required, at least 1"})
	}
	if !handlekind.Known(req.GetKind()) {
		bad = append(bad, apierror.FieldViolation{Field: "kind", Description: "unknown handle kind"})
	}
	if len(req.GetLabel()) > maxLabelBytes {
		bad = append(bad, apierror.FieldViolation{Field: "label", Description: fmt.Sprintf("at most %d bytes", maxLabelBytes)})
	}
	ttl := DefaultHandleTTL
	if req.GetTtl() != nil {
		if err := req.GetTtl().CheckValid(); err != nil {
			bad = append(bad, apierror.FieldViolation{Field: "ttl", Description: "not a valid duration"})
		} else {
			ttl = req.GetTtl().AsDuration()
			if ttl <= 0 || ttl > MaxHandleTTL {
				bad = append(bad, apierror.FieldViolation{Field: "ttl", Description: fmt.Sprintf("must be positive and at most %s", MaxHandleTTL)})
			}
		}
	}
	if len(bad) > 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "the handle request is invalid", bad...)
	}
	kind := handlekind.Of(req.GetKind())
	if err := s.inScope(ctx, req.GetTaskId(), req.GetRequester(), kind, req.GetTarget()); err != nil {
		s.log.WarnContext(ctx, "handle refused", "reason", apierror.Reason(err), "task_id", req.GetTaskId(),
			"requester", req.GetRequester(), "capability", req.GetCapability())
		return nil, err
	}

	exp := timestamppb.New(s.now().Add(ttl))
	b := &policyv1.HandleBinding{
		TaskId:          req.GetTaskId(),
		Requester:       req.GetRequester(),
		Capability:      req.GetCapability(),
		Target:          req.GetTarget(),
		Label:           req.GetLabel(),
		MappingId:       req.GetMappingId(),
		MappingRevision: req.GetMappingRevision(),
		ExpireTime:      exp,
		Kind:            kind,
	}
	token := ids.Token("h")
	if err := s.store.CreateHandle(ctx, handleKey(token), b); err != nil {
		return nil, s.storeError(ctx, err, "store the handle")
	}
	s.log.InfoContext(ctx, "handle minted", "token_prefix", token[:6], "task_id", b.GetTaskId(),
		"requester", b.GetRequester(), "capability", b.GetCapability(), "kind", handlekind.Name(kind), "mapping_id", b.GetMappingId(),
		"mapping_revision", b.GetMappingRevision(), "expire_time", exp.AsTime())
	return &policyv1.Handle{Token: token, Label: b.GetLabel(), ExpireTime: exp}, nil
}

// ResolveHandle checks a handle against the caller's task, requester, field
// kind, capability, expiry and mapping revision, in that order, then
// re-authorizes the current state. Every refusal happens before the target
// leaves this service, and no error names the target.
func (s *Server) ResolveHandle(ctx context.Context, req *policyv1.ResolveHandleRequest) (*policyv1.ResolveHandleResponse, error) {
	var bad []apierror.FieldViolation
	for _, f := range []struct{ name, v string }{
		{"token", req.GetToken()}, {"task_id", req.GetTaskId()}, {"requester.id", req.GetRequester().GetId()},
		{"capability", req.GetCapability()}, {"mapping_id", req.GetMappingId()},
	} {
		if f.v == "" {
			bad = append(bad, apierror.FieldViolation{Field: f.name, Description: "required"})
		}
	}
	if req.GetMappingRevision() <= 0 {
		bad = append(bad, apierror.FieldViolation{Field: "mapping_revision", Description: "required, at least 1"})
	}
	if len(bad) > 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "the handle resolution request is incomplete", bad...)
	}

	tok := tokenPrefix(req.GetToken())
	if !wellFormed(req.GetToken()) {
		return nil, s.refuse(ctx, req, codes.NotFound, "HANDLE_UNKNOWN", fmt.Sprintf("handle %s is not known", tok))
	}
	b, err := s.binding(ctx, handleKey(req.GetToken()))
	if errors.Is(err, store.ErrNotFound) {
		return nil, s.refuse(ctx, req, codes.NotFound, "HANDLE_UNKNOWN", fmt.Sprintf("handle %s is not known", tok))
	}
	if err != nil {
		return nil, s.storeError(ctx, err, "read the handle")
	}
	switch {
	case b.GetTaskId() != req.GetTaskId():
		return nil, s.refuse(ctx, req, codes.PermissionDenied, "HANDLE_TASK_MISMATCH",
			fmt.Sprintf("handle %s belongs to another task", tok))
	case b.GetRequester() != req.GetRequester().GetId():
		return nil, s.refuse(ctx, req, codes.PermissionDenied, "HANDLE_REQUESTER_MISMATCH",
			fmt.Sprintf("handle %s belongs to another requester", tok))
	case handlekind.Of(b.GetKind()) != handlekind.Of(req.GetKind()):
		return nil, s.refuse(ctx, req, codes.PermissionDenied, "HANDLE_KIND_MISMATCH",
			fmt.Sprintf("handle %s is a %s handle; this field takes a %s handle from the catalogue", tok, handlekind.Name(b.GetKind()), handlekind.Name(req.GetKind())))
	case b.GetCapability() != req.GetCapability():
		return nil, s.refuse(ctx, req, codes.PermissionDenied, "HANDLE_CAPABILITY_MISMATCH",
			fmt.Sprintf("handle %s was minted for capability %s, not %s", tok, b.GetCapability(), req.GetCapability()))
	case !s.now().Before(b.GetExpireTime().AsTime()):
		return nil, s.refuse(ctx, req, codes.FailedPrecondition, "HANDLE_EXPIRED",
			fmt.Sprintf("handle %s expired at %s; mint a new one", tok, b.GetExpireTime().AsTime().UTC().Format("2006-01-02T15:04:05Z")))
	case b.GetMappingId() != req.GetMappingId() || b.GetMappingRevision() != req.GetMappingRevision():
		return nil, s.refuse(ctx, req, codes.FailedPrecondition, "HANDLE_MAPPING_CHANGED",
			fmt.Sprintf("handle %s is bound to mapping %s revision %d, not %s revision %d; mint a new one",
				tok, b.GetMappingId(), b.GetMappingRevision(), req.GetMappingId(), req.GetMappingRevision()))
	}

	// Re-authorize the current state. The mapping's connection and the
	// capability revision the bound revision was reviewed against never
	// change (see mappingFacts): the first use of a revision reads them
	// from the registry and requires it current and active; after that,
	// whether it still is, is the orchestrator's ResolveExecution, made in
	// the same governed call before it asks policy (the only peer allowed
	// to call ResolveHandle and Decide). Policy must still allow it.
	var m *registryv1.Mapping // the registry's current mapping, when read
	f, ok := s.mappings.get(b.GetMappingId())
	if !ok || f.revision != b.GetMappingRevision() {
		if m, f, err = s.readMapping(ctx, b.GetMappingId()); err != nil {
			return nil, err
		}
	}
	if err := implements(b.GetMappingId(), f, b.GetCapability()); err != nil {
		return nil, err
	}
	if m != nil && (m.GetRevision() != b.GetMappingRevision() || m.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE) {
		return nil, s.refuse(ctx, req, codes.FailedPrecondition, "HANDLE_MAPPING_CHANGED",
			fmt.Sprintf("handle %s is bound to mapping %s revision %d, which is now revision %d and %s; mint a new one",
				tok, m.GetId(), b.GetMappingRevision(), m.GetRevision(), mappingStateName(m.GetState())))
	}
	// The mapping is active at this revision, so the capability revision
	// it was reviewed against is the current one (a capability revision
	// sends its active mappings to review in the same transaction): its
	// contract comes from the cache.
	c, err := s.capabilityAt(ctx, b.GetCapability(), f.capabilityRevision, req.GetEffectClass())
	if err != nil {
		return nil, err
	}
	authz := s.decide(ctx, query{
		principal:       req.GetRequester(),
		capability:      b.GetCapability(),
		connectionID:    f.connectionID,
		target:          b.GetTarget(),
		taskID:          b.GetTaskId(),
		purpose:         req.GetPurpose(),
		effect:          c.GetEffectClass(),
		approval:        c.GetApproval(),
		mappingID:       b.GetMappingId(),
		mappingRevision: b.GetMappingRevision(),
	})
	if authz.GetDecision() != policyv1.Decision_DECISION_ALLOW {
		return nil, apierror.New(codes.PermissionDenied, "POLICY_DENIED",
			fmt.Sprintf("policy no longer allows capability %s for handle %s", b.GetCapability(), tok),
			map[string]string{"capability": b.GetCapability(), "policy_revision": authz.GetPolicyRevision()})
	}
	s.log.DebugContext(ctx, "handle resolved", "token_prefix", tok, "task_id", b.GetTaskId(),
		"capability", b.GetCapability(), "mapping_id", b.GetMappingId(), "mapping_revision", b.GetMappingRevision())
	return &policyv1.ResolveHandleResponse{Binding: b, Authorization: authz}, nil
}

// maxBindingEntries bounds the handle binding cache: a few MiB at most.
const maxBindingEntries = 8192

// binding returns the handle binding stored under key, from the cache or
// the store. A binding never changes once stored (CreateHandle refuses a
// second one under a key; only expired ones are deleted, and expiry is
// checked on every use), so a kept binding cannot go stale; saving the
// read matters because every governed call resolves its handles. A key
// not found is not kept: another replica may be minting it.
func (s *Server) binding(ctx context.Context, key string) (*policyv1.HandleBinding, error) {
	return readThrough(ctx, s.bindings, key, s.store.GetHandle)
}

// refuse logs a handle refusal and returns its error. Neither names the
// target.
func (s *Server) refuse(ctx context.Context, req *policyv1.ResolveHandleRequest, code codes.Code, reason, msg string) error {
	s.log.InfoContext(ctx, "handle refused", "reason", reason, "token_prefix", tokenPrefix(req.GetToken()),
		"task_id", req.GetTaskId(), "requester", req.GetRequester().GetId(), "capability", req.GetCapability())
	return apierror.New(code, reason, msg, map[string]string{"capability": req.GetCapability()})
}
