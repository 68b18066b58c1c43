// Package grant owns execution grants: what the orchestrator signs to
// authorize exactly one remote call, and what the adapter checks before it
// starts a process or sends a byte. A grant binds the call's identity
// (grant, attempt, intent, task), what it runs (capability, mapping and
// revision, connection and config revision, target) and what it sends (the
// digests of the remote arguments and limits), and it expires. The adapter
// executes nothing without one, nothing that differs from it, and no grant
// twice.
package grant

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/identity"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Type names the payload, so no other statement a service signs can be
// taken for a grant.
const Type = "v0m3.execution-grant/v1"

// Skew is the clock difference between orchestrator and adapter a grant
// tolerates on its issue and expiry times.
const Skew = 5 * time.Second

// Reasons of a refused grant (google.rpc.ErrorInfo reasons).
const (
	// ReasonMissing: the request carries no grant.
	ReasonMissing = "GRANT_MISSING"
	// ReasonInvalid: not a grant signed by the orchestrator.
	ReasonInvalid = "GRANT_INVALID"
	// ReasonExpired: the grant's time has passed (or has not come).
	ReasonExpired = "GRANT_EXPIRED"
	// ReasonUsed: the grant was already used once.
	ReasonUsed = "GRANT_USED"
	// ReasonMismatch: the request differs from what the grant binds.
	ReasonMismatch = "GRANT_MISMATCH"
	// ReasonUnverifiable: the adapter has no certificate to verify grants
	// with and was not started for plaintext development.
	ReasonUnverifiable = "GRANT_UNVERIFIABLE"
)

// Grant is the signed payload. Field names are the JSON wire names and
// the names a mismatch reports.
type Grant struct {
	Type            string `json:"typ"`
	ID              string `json:"grant_id"`
	AttemptID       string `json:"attempt_id"`
	IntentID        string `json:"intent_id"`
	TaskID          string `json:"task_id"`
	Capability      string `json:"capability"`
	MappingID       string `json:"mapping_id"`
	MappingRevision int64  `json:"mapping_revision"`
	ConnectionID    string `json:"connection_id"`
	ConfigRevision  int64  `json:"config_revision"`
	// TargetKind is "tool" or "resource"; Target is the tool name or the
	// exact resource URI read (for a handle-bound resource mapping, the
	// handle's resolved target).
	TargetKind string `json:"target_kind"`
	Target     string `json:"target"`
	// ArgumentsDigest is digest.JSON of the exact remote arguments ({} for
	// none); LimitsDigest that of the limits enforced.
	ArgumentsDigest string `json:"arguments_digest"`
	LimitsDigest    string `json:"limits_digest"`
	// OutputSchemaDigest is digest.JSON of the output schema the result is
	// validated against, "" for none: a call cannot be granted under one
	// schema and judged by another.
	OutputSchemaDigest string `json:"output_schema_digest,omitempty"`
	// Subject and SubjectToken are set when the connection exchanges a
	// requester's identity for its token (OAuth token exchange): the
	// task's verified requester, and the subject token the orchestrator
	// signed for this attempt (see subject.go). Signed inside the grant,
	// the token is bound to the attempt and cannot travel to another.
	Subject      string `json:"subject,omitempty"`
	SubjectToken string `json:"subject_token,omitempty"`
	// IssuedAt and ExpiresAt are Unix seconds.
	IssuedAt  int64 `json:"iat"`
	ExpiresAt int64 `json:"exp"`
}

// Error is a refused grant with its reason and, for a mismatch, the field.
type Error struct {
	Reason string
	Field  string
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

func refused(reason, field, format string, args ...any) *Error {
	return &Error{Reason: reason, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// For returns the grant an ExecuteRequest needs, every call field taken
// from req, with the given identity, capability and lifetime. The
// orchestrator builds the request first and the grant from it, so the two
// cannot drift apart.
func For(req *adapterv1.ExecuteRequest, id, intentID, capability string, now time.Time, ttl time.Duration) (Grant, error) {
	g, err := fromRequest(req)
	if err != nil {
		return Grant{}, err
	}
	g.Type, g.ID, g.IntentID, g.Capability = Type, id, intentID, capability
	g.IssuedAt, g.ExpiresAt = now.Unix(), now.Add(ttl).Unix()
	return g, nil
}

// fromRequest returns the call fields of req as a grant would bind them.
func fromRequest(req *adapterv1.ExecuteRequest) (Grant, error) {
	args, err := ArgumentsDigest(req.GetArguments())
	if err != nil {
		return Grant{}, err
	}
	limits, err := digest.JSON(limitsValue(req.GetLimits()))
	if err != nil {
		return Grant{}, fmt.Errorf("grant: digest limits: %w", err)
	}
	var schema string
	if s := req.GetOutputSchema(); s != nil {
		if schema, err = digest.JSON(s.AsMap()); err != nil {
			return Grant{}, fmt.Errorf("grant: digest output schema: %w", err)
		}
	}
	return Grant{
		AttemptID: req.GetAttemptId(), TaskID: req.GetTaskId(),
		MappingID: req.GetMappingId(), MappingRevision: req.GetMappingRevision(),
		ConnectionID: req.GetConnectionId(), ConfigRevision: req.GetConfigRevision(),
		TargetKind: kindName(req.GetTarget().GetKind()), Target: req.GetTarget().GetName(),
		ArgumentsDigest: args, LimitsDigest: limits, OutputSchemaDigest: schema,
	}, nil
}

// ArgumentsDigest is the digest a grant binds for remote arguments: the
// canonical JSON of the object sent, {} when there are none.
func ArgumentsDigest(args *structpb.Struct) (string, error) {
	m := args.AsMap()
	if m == nil {
		m = map[string]any{}
	}
	d, err := digest.JSON(m)
	if err != nil {
		return "", fmt.Errorf("grant: digest arguments: %w", err)
	}
	return d, nil
}

// limitsValue is the limits as plain JSON values (protojson field names
// would also do; this keeps the digest independent of proto options).
func limitsValue(l *registryv1.Limits) map[string]any {
	types := l.GetAllowedMediaTypes()
	if types == nil {
		types = []string{}
	}
	v := map[string]any{
		"max_response_bytes":      l.GetMaxResponseBytes(),
		"max_items":               l.GetMaxItems(),
		"allowed_media_types":     types,
		"asset_reference_allowed": l.GetAssetReferenceAllowed(),
		"drop_disallowed_items":   l.GetDropDisallowedItems(),
	}
	// Only a policy other than declining enters the digest, so the
	// digest of limits without one is what it always was.
	if e := l.GetElicitation(); e != registryv1.ElicitationPolicy_ELICITATION_POLICY_UNSPECIFIED &&
		e != registryv1.ElicitationPolicy_ELICITATION_POLICY_DECLINE {
		v["elicitation"] = e.String()
	}
	return v
}

func kindName(k registryv1.RemoteKind) string {
	switch k {
	case registryv1.RemoteKind_REMOTE_KIND_TOOL:
		return "tool"
	case registryv1.RemoteKind_REMOTE_KIND_RESOURCE:
		return "resource"
	}
	return ""
}

// Sign returns g as a compact JWS signed with the orchestrator's
// credentials.
func Sign(creds *identity.Credentials, g Grant) (string, error) {
	if creds == nil {
		return "", errors.New("grant: no credentials to sign with")
	}
	payload, err := json.Marshal(g)
	if err != nil {
		return "", fmt.Errorf("grant: %w", err)
	}
	return creds.Sign(payload)
}

// Verify checks token: signed by the orchestrator service under the CA
// creds trusts, a grant, and within its time at now. It returns the grant
// or an *Error.
func Verify(creds *identity.Credentials, token string, now time.Time) (Grant, error) {
	if token == "" {
		return Grant{}, refused(ReasonMissing, "", "the request carries no execution grant; only the orchestrator authorizes calls")
	}
	payload, err := creds.Verify(token, identity.Orchestrator)
	if err != nil {
		return Grant{}, refused(ReasonInvalid, "", "the execution grant is not signed by the orchestrator: %v", err)
	}
	var g Grant
	if err := json.Unmarshal(payload, &g); err != nil || g.Type != Type || g.ID == "" {
		return Grant{}, refused(ReasonInvalid, "", "the signed statement is not an execution grant")
	}
	switch {
	case now.After(time.Unix(g.ExpiresAt, 0).Add(Skew)):
		return Grant{}, refused(ReasonExpired, "", "execution grant %s expired at %s", g.ID, time.Unix(g.ExpiresAt, 0).UTC().Format(time.RFC3339))
	case now.Add(Skew).Before(time.Unix(g.IssuedAt, 0)):
		return Grant{}, refused(ReasonExpired, "", "execution grant %s is issued in the future (%s); check the clocks", g.ID, time.Unix(g.IssuedAt, 0).UTC().Format(time.RFC3339))
	}
	return g, nil
}

// Match reports the first field in which req differs from what g binds,
// as a *Error with ReasonMismatch, or nil when the request is exactly what
// was granted.
func (g Grant) Match(req *adapterv1.ExecuteRequest) error {
	got, err := fromRequest(req)
	if err != nil {
		return refused(ReasonMismatch, "arguments", "the request cannot be compared with its grant: %v", err)
	}
	for _, f := range []struct {
		name       string
		want, have any
	}{
		{"attempt_id", g.AttemptID, got.AttemptID},
		{"task_id", g.TaskID, got.TaskID},
		{"connection_id", g.ConnectionID, got.ConnectionID},
		{"config_revision", g.ConfigRevision, got.ConfigRevision},
		{"mapping_id", g.MappingID, got.MappingID},
		{"mapping_revision", g.MappingRevision, got.MappingRevision},
		{"target_kind", g.TargetKind, got.TargetKind},
		{"target", g.Target, got.Target},
		{"arguments", g.ArgumentsDigest, got.ArgumentsDigest},
		{"limits", g.LimitsDigest, got.LimitsDigest},
		{"output_schema", g.OutputSchemaDigest, got.OutputSchemaDigest},
	} {
		if f.want != f.have {
			// Values are not echoed: a target or argument may be a
			// server-side value the caller should not learn from an error.
			return refused(ReasonMismatch, f.name, "the request's %s differs from what execution grant %s authorizes", f.name, g.ID)
		}
	}
	return nil
}

// Ledger remembers the grants already used until they expire, so a
// replayed request is refused. It is in memory: it protects one adapter
// process, which is why grants live only an attempt's timeout.
type Ledger struct {
	mu    sync.Mutex
	used  map[string]time.Time // grant id -> when it may be forgotten
	sweep time.Time
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger { return &Ledger{used: map[string]time.Time{}} }

// Use records g as used at now and reports whether it was unused.
func (l *Ledger) Use(g Grant, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.After(l.sweep) {
		for id, until := range l.used {
			if now.After(until) {
				delete(l.used, id)
			}
		}
		l.sweep = now.Add(time.Minute)
	}
	if _, ok := l.used[g.ID]; ok {
		return false
	}
	// Kept until no clock could still accept it.
	l.used[g.ID] = time.Unix(g.ExpiresAt, 0).Add(2 * Skew)
	return true
}
