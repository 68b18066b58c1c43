package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/paging"
	"github.com/v0m3/v0m3/internal/reach"
	"github.com/v0m3/v0m3/internal/redact"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// credentialRefPattern is the shape of a credential reference
// ("file:/var/run/secrets/...", "env:TOKEN", "secret:ns/name/key"). Requiring
// a scheme keeps a pasted secret value from being stored as a reference.
var credentialRefPattern = regexp.MustCompile(`^[a-z][a-z0-9+.-]*:\S+$`)

// credentialRefProblem says what is wrong with a credential reference, or
// "" when nothing is. The adapter reads a "file:" reference only inside
// the connection's own directory under its credential roots
// (<root>/<connection id>/); a relative name that climbs out of it is
// refused here already. Whether an absolute path lies inside is the
// adapter's to decide: it alone knows its roots.
func credentialRefProblem(ref string) string {
	if !credentialRefPattern.MatchString(ref) {
		return `must be a reference such as "file:token" (a file in the connection's credential directory), never a credential value`
	}
	if p, ok := strings.CutPrefix(ref, "file:"); ok && !filepath.IsAbs(p) && !filepath.IsLocal(p) {
		return fmt.Sprintf("%q leaves the connection's credential directory; name a file inside it, such as \"file:token\"", ref)
	}
	return ""
}

// CreateConnection records a new local identity for one configured server,
// at config revision 1 and review state PENDING.
func (s *Server) CreateConnection(ctx context.Context, req *registryv1.CreateConnectionRequest) (*registryv1.Connection, error) {
	creator, err := s.authz.Require(ctx, authz.ConnectionCreate, authz.Resource{Type: "connection"}, map[string]string{"owner": req.GetOwner()})
	if err != nil {
		return nil, err
	}
	var v []apierror.FieldViolation
	if strings.TrimSpace(req.GetDisplayName()) == "" {
		v = append(v, apierror.FieldViolation{Field: "display_name", Description: "a friendly name for people is required"})
	}
	if strings.TrimSpace(req.GetOwner()) == "" {
		v = append(v, apierror.FieldViolation{Field: "owner", Description: "the team or person responsible is required"})
	}
	cv, reason := s.validateConfig(req.GetTransport(), req.GetCredentialRef())
	v = append(v, cv...)
	if len(v) > 0 {
		return nil, invalidConnection(v, reason)
	}

	now := s.timestamp()
	c := &registryv1.Connection{
		Id:                ids.New("conn"),
		DisplayName:       req.GetDisplayName(),
		Owner:             req.GetOwner(),
		ReviewState:       registryv1.ReviewState_REVIEW_STATE_PENDING,
		State:             registryv1.ConnectionState_CONNECTION_STATE_ACTIVE,
		ConfigRevision:    1,
		CreateTime:        now,
		UpdateTime:        now,
		Transport:         s.resolveTransport(ctx, req.GetTransport()),
		ImageDigest:       req.GetImageDigest(),
		CredentialScope:   req.GetCredentialScope(),
		CredentialRef:     req.GetCredentialRef(),
		CredentialVersion: req.GetCredentialVersion(),
		WorkloadDigest:    req.GetWorkloadDigest(),
		CreatedBy:         actor(creator),
		ProposedBy:        actor(creator),
	}
	// Nothing runs before a review; revision 1 is what will serve.
	c.ServingConfigRevision = 1
	d, err := configDigest(c)
	if err != nil {
		return nil, invalidConnection([]apierror.FieldViolation{{Field: "transport", Description: err.Error()}}, "")
	}
	c.ConfigDigest = d
	rev := configRevisionOf(c, "created", now)
	rev.ReviewRequired = true
	ev := s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONNECTION_CREATED, c.GetId(), "", "",
		fmt.Sprintf("connection %q created by %s for owner %q at config revision 1 (%s); pending review", c.GetDisplayName(), c.GetCreatedBy(), c.GetOwner(), transportKind(c.GetTransport())))
	if err := s.st.CreateConnection(ctx, c, rev, ev); err != nil {
		return nil, s.storeError(ctx, err, "create connection", nil)
	}
	s.notify()
	s.log.InfoContext(ctx, "connection created", "connection_id", c.GetId(), "transport", transportKind(c.GetTransport()),
		"config_digest", c.GetConfigDigest(), "created_by", c.GetCreatedBy())
	return c, nil
}

// GetConnection returns one connection, retired or not.
func (s *Server) GetConnection(ctx context.Context, req *registryv1.GetConnectionRequest) (*registryv1.Connection, error) {
	if err := s.requireRead(ctx, authz.ConnectionRead, "connection", req.GetId()); err != nil {
		return nil, err
	}
	if req.GetId() == "" {
		return nil, required("id", "the connection id, e.g. conn_...")
	}
	return s.getConnection(ctx, req.GetId())
}

func (s *Server) getConnection(ctx context.Context, id string) (*registryv1.Connection, error) {
	c, err := s.st.GetConnection(ctx, id)
	if err != nil {
		return nil, s.storeError(ctx, err, "get connection", func() error { return connectionUnknown(id) })
	}
	withServing(c)
	return c, nil
}

// withServing fills the serving revision of a connection stored before the
// registry recorded one: until then every revision served at once.
func withServing(c *registryv1.Connection) {
	if c.GetServingConfigRevision() == 0 {
		c.ServingConfigRevision = c.GetConfigRevision()
	}
}

// ListConnections returns connections, oldest first; retired ones only when
// asked for.
func (s *Server) ListConnections(ctx context.Context, req *registryv1.ListConnectionsRequest) (*registryv1.ListConnectionsResponse, error) {
	if err := s.requireRead(ctx, authz.ConnectionRead, "connection", ""); err != nil {
		return nil, err
	}
	all, err := s.st.ListConnections(ctx)
	if err != nil {
		return nil, s.storeError(ctx, err, "list connections", nil)
	}
	for _, c := range all {
		withServing(c)
	}
	out := slices.DeleteFunc(all, func(c *registryv1.Connection) bool {
		return !req.GetIncludeRetired() && c.GetState() == registryv1.ConnectionState_CONNECTION_STATE_RETIRED
	})
	page, next, err := paging.Page(req, paging.Filter("include_retired", strconv.FormatBool(req.GetIncludeRetired())), out,
		func(c *registryv1.Connection) string { return paging.TimeKey(c.GetCreateTime(), c.GetId()) })
	if err != nil {
		return nil, err
	}
	return &registryv1.ListConnectionsResponse{Connections: page, NextPageToken: next}, nil
}

// UpdateConnection replaces a connection's configuration (when transport is
// set) and its descriptive fields (display name, owner, sandbox: those that
// are set). A different configuration digest creates a new config revision;
// it moves every active mapping of the connection to REVIEW_REQUIRED unless
// it is a rotation (a new credential_version of the same reference) within
// the declared credential scope (rotationKeepsMappings). A change of what
// runs, what is reached or a credential reference sends the connection
// itself back to review too. The update is a compare-and-set on
// expected_config_revision.
//
// Without a transport the configuration is left as it is: only descriptive
// fields change and no revision is created.
func (s *Server) UpdateConnection(ctx context.Context, req *registryv1.UpdateConnectionRequest) (*registryv1.Connection, error) {
	changer, err := s.authz.Require(ctx, authz.ConnectionUpdate, authz.Resource{Type: "connection", ID: req.GetId()}, nil)
	if err != nil {
		return nil, err
	}
	var v []apierror.FieldViolation
	if req.GetId() == "" {
		v = append(v, apierror.FieldViolation{Field: "id", Description: "the connection id is required"})
	}
	if req.GetExpectedConfigRevision() <= 0 {
		v = append(v, apierror.FieldViolation{Field: "expected_config_revision", Description: "the config revision you read (>= 1) is required"})
	}
	var reason string
	if req.GetTransport() != nil {
		var cv []apierror.FieldViolation
		cv, reason = s.validateConfig(req.GetTransport(), req.GetCredentialRef())
		v = append(v, cv...)
	}
	if req.GetKeepServing() && req.GetCredentialRef() != "" {
		v = append(v, apierror.FieldViolation{Field: "keep_serving",
			Description: "a credential_ref is resolved by the adapter at call time, so the previous revision cannot keep serving; keep_serving is for a credential that lives in the workload"})
	}
	if len(v) > 0 {
		return nil, invalidConnection(v, reason)
	}
	// File I/O for the executable digest happens before the transaction.
	var transport *registryv1.Transport
	if req.GetTransport() != nil {
		transport = s.resolveTransport(ctx, req.GetTransport())
	}

	var out *registryv1.Connection
	var revised bool
	err = s.updateConnection(ctx, req.GetId(), func(u *ConnectionUpdate) error {
		revised = false
		c := u.Connection
		if c.GetState() == registryv1.ConnectionState_CONNECTION_STATE_RETIRED {
			return connectionRetired(c)
		}
		if c.GetConfigRevision() != req.GetExpectedConfigRevision() {
			return apierror.New(codes.Aborted, "CONFIG_REVISION_CONFLICT",
				fmt.Sprintf("connection %s is at config revision %d, not %d; read it again and reapply your change",
					c.GetId(), c.GetConfigRevision(), req.GetExpectedConfigRevision()),
				map[string]string{"connection_id": c.GetId(), "config_revision": strconv.FormatInt(c.GetConfigRevision(), 10)})
		}
		now := s.timestamp()
		changed := false
		if n := req.GetDisplayName(); n != "" && n != c.GetDisplayName() {
			c.DisplayName, changed = n, true
		}
		if o := req.GetOwner(); o != "" && o != c.GetOwner() {
			c.Owner, changed = o, true
		}
		if sb := req.GetSandbox(); sb != nil && !proto.Equal(sb, c.GetSandbox()) {
			c.Sandbox, changed = sb, true
		}
		if transport != nil {
			next := proto.CloneOf(c)
			next.Transport = transport
			next.ImageDigest = req.GetImageDigest()
			next.CredentialScope = req.GetCredentialScope()
			next.CredentialRef = req.GetCredentialRef()
			next.CredentialVersion = req.GetCredentialVersion()
			next.WorkloadDigest = req.GetWorkloadDigest()
			d, err := configDigest(next)
			if err != nil {
				return invalidConnection([]apierror.FieldViolation{{Field: "transport", Description: err.Error()}}, "")
			}
			if d != c.GetConfigDigest() {
				reason := req.GetReason()
				if reason == "" {
					reason = "configuration updated"
				}
				s.reviseConfig(u, next, d, reason, actor(changer), now)
				if !req.GetKeepServing() {
					u.Connection.ServingConfigRevision = u.Connection.GetConfigRevision()
				}
				c, changed, revised = u.Connection, true, true
			}
		}
		if changed {
			c.UpdateTime = now
			if !revised {
				u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONNECTION_UPDATED, c.GetId(), "", "",
					"display name, owner or sandbox updated; no new config revision"))
			}
		}
		out = c
		return nil
	})
	if err != nil {
		return nil, err
	}
	if revised {
		s.log.InfoContext(ctx, "connection config revised", "connection_id", out.GetId(), "config_revision", out.GetConfigRevision(),
			"config_digest", out.GetConfigDigest(), "review_state", out.GetReviewState().String(), "by", actor(changer))
	}
	return out, nil
}

// reviseConfig makes next (with digest d) the connection's new config
// revision, made by who. When what runs or is reached changed, the
// connection itself is pending review again, proposed by who; a
// credential-only change keeps its review state. Active mappings stay
// active only through a rotation (see rotationKeepsMappings): anything else
// sends them back to review, because they were reviewed against a
// configuration whose meaning no longer holds. Approvals are bound to the
// config revision either way, so the new revision invalidates every
// approval given under the old one.
func (s *Server) reviseConfig(u *ConnectionUpdate, next *registryv1.Connection, d, reason, who string, now *timestamppb.Timestamp) {
	prev := u.Connection.GetConfigRevision()
	rereview := reviewedConfigChanged(u.Connection, next)
	keep := rotationKeepsMappings(u.Connection, next)
	next.ConfigRevision = prev + 1
	next.ConfigDigest = d
	// A newer revision supersedes a failed rollout of an older one.
	next.RolloutFailure = nil
	detail := fmt.Sprintf("config revision %d (%s) replaced revision %d", next.GetConfigRevision(), reason, prev)
	if rereview {
		next.ReviewState = registryv1.ReviewState_REVIEW_STATE_PENDING
		next.ProposedBy = who
		detail += "; what runs, what is reached or where its credential is read changed, so the connection is pending review"
	}
	var kept []string
	for _, m := range u.Mappings {
		if m.GetState() == registryv1.MappingState_MAPPING_STATE_ACTIVE && keep {
			kept = append(kept, m.GetId())
		}
	}
	if keep {
		detail += fmt.Sprintf("; the credential changed within its declared scope, so %d active mapping(s) stay active and approvals bound to revision %d are invalidated", len(kept), prev)
	} else if !rereview && u.Connection.GetCredentialScope() != next.GetCredentialScope() {
		detail += fmt.Sprintf("; the declared credential scope changed (%q to %q), so active mappings need review", u.Connection.GetCredentialScope(), next.GetCredentialScope())
	}
	u.Connection = next
	u.Revision = configRevisionOf(next, reason, now)
	u.Revision.CreatedBy = who
	u.Revision.ReviewRequired = rereview
	u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONFIG_REVISED, next.GetId(), "", "", detail))
	if keep {
		return
	}
	for _, m := range u.Mappings {
		if m.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE {
			continue
		}
		m.State = registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED
		m.StateReason = fmt.Sprintf("connection config revision %d (%s) replaced revision %d the mapping was reviewed against",
			next.GetConfigRevision(), reason, m.GetConfigRevision())
		u.WriteMappings = append(u.WriteMappings, m)
		u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_REVIEW_REQUIRED,
			next.GetId(), m.GetId(), "", m.GetStateReason()))
	}
}

// rotationKeepsMappings reports whether the change from prev to next is a
// credential rotation that keeps what its mappings were reviewed for: what
// runs and is reached is unchanged, and so are the credential's reference
// and declared scope. Only the credential's version differs. A mapping's
// meaning (which tool, what it may do with the caller's data) does not
// depend on which copy of an equally scoped credential the server holds;
// a broadened or narrowed scope does change it, and goes back to review.
func rotationKeepsMappings(prev, next *registryv1.Connection) bool {
	return !reviewedConfigChanged(prev, next) && prev.GetCredentialScope() == next.GetCredentialScope()
}

// RetireConnection retires a connection and its mappings. Everything that
// refers to it stays readable. Retiring a retired connection changes nothing.
func (s *Server) RetireConnection(ctx context.Context, req *registryv1.RetireConnectionRequest) (*registryv1.Connection, error) {
	if _, err := s.authz.Require(ctx, authz.ConnectionRetire, authz.Resource{Type: "connection", ID: req.GetId()}, nil); err != nil {
		return nil, err
	}
	if req.GetId() == "" {
		return nil, required("id", "the connection id to retire")
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "retired"
	}
	var out *registryv1.Connection
	err := s.updateConnection(ctx, req.GetId(), func(u *ConnectionUpdate) error {
		c := u.Connection
		out = c
		if c.GetState() == registryv1.ConnectionState_CONNECTION_STATE_RETIRED {
			return nil
		}
		now := s.timestamp()
		c.State = registryv1.ConnectionState_CONNECTION_STATE_RETIRED
		c.RetireTime, c.UpdateTime = now, now
		u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONNECTION_RETIRED, c.GetId(), "", "",
			"connection retired: "+reason))
		for _, m := range u.Mappings {
			if m.GetState() == registryv1.MappingState_MAPPING_STATE_RETIRED {
				continue
			}
			m.State = registryv1.MappingState_MAPPING_STATE_RETIRED
			m.StateReason = "connection retired: " + reason
			u.WriteMappings = append(u.WriteMappings, m)
			u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_RETIRED, c.GetId(), m.GetId(), "", m.GetStateReason()))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.log.InfoContext(ctx, "connection retired", "connection_id", out.GetId())
	return out, nil
}

// ListConfigRevisions returns every configuration revision of a connection,
// oldest first.
func (s *Server) ListConfigRevisions(ctx context.Context, req *registryv1.ListConfigRevisionsRequest) (*registryv1.ListConfigRevisionsResponse, error) {
	if err := s.requireRead(ctx, authz.ConnectionRead, "connection", req.GetConnectionId()); err != nil {
		return nil, err
	}
	if req.GetConnectionId() == "" {
		return nil, required("connection_id", "the connection whose revisions to list")
	}
	if _, err := s.getConnection(ctx, req.GetConnectionId()); err != nil {
		return nil, err
	}
	revs, err := s.st.ListConfigRevisions(ctx, req.GetConnectionId())
	if err != nil {
		return nil, s.storeError(ctx, err, "list config revisions", nil)
	}
	page, next, err := paging.Page(req, paging.Filter("connection_id", req.GetConnectionId()), revs,
		func(r *registryv1.ConfigRevision) string { return paging.NumKey(r.GetRevision(), "") })
	if err != nil {
		return nil, err
	}
	return &registryv1.ListConfigRevisionsResponse{Revisions: page, NextPageToken: next}, nil
}

// invalidConnection is INVALID_ARGUMENT with every violation; reason is
// the most specific refusal found, INVALID_CONNECTION when none was.
func invalidConnection(v []apierror.FieldViolation, reason string) error {
	if reason == "" {
		reason = "INVALID_CONNECTION"
	}
	return apierror.InvalidArgument(reason, "invalid connection: "+violationText(v), v...)
}

// ReasonSecretInEnv is the ErrorInfo reason of a stdio connection whose
// environment carries a literal secret.
const ReasonSecretInEnv = "SECRET_IN_ENV"

// ReasonSecretInArgs is the ErrorInfo reason of a stdio connection whose
// command-line arguments carry a literal secret: arguments are readable by
// anyone who can list processes.
const ReasonSecretInArgs = "SECRET_IN_ARGS"

// validateConfig checks a transport and credential reference. reason is
// the ErrorInfo reason of the most specific refusal among the violations
// (SECRET_IN_ENV and SECRET_IN_ARGS before ENDPOINT_NOT_ALLOWED,
// EXECUTABLE_NOT_ALLOWED and ENV_NOT_ALLOWED), or "" for plain invalid
// input.
func (s *Server) validateConfig(t *registryv1.Transport, credentialRef string) (v []apierror.FieldViolation, reason string) {
	refuse := func(r string) {
		if reason == "" || r == ReasonSecretInEnv || r == ReasonSecretInArgs && reason != ReasonSecretInEnv {
			reason = r
		}
	}
	switch k := t.GetKind().(type) {
	case nil:
		v = append(v, apierror.FieldViolation{Field: "transport", Description: "a transport (stdio, streamable_http or direct) is required"})
	case *registryv1.Transport_Stdio:
		command := k.Stdio.GetCommand()
		switch {
		case strings.TrimSpace(command) == "":
			v = append(v, apierror.FieldViolation{Field: "transport.stdio.command", Description: "the executable path or name is required"})
		case filepath.IsAbs(command) || strings.Contains(command, "/"):
			// A bare name is resolved against the server's PATH by the
			// adapter, which checks what it resolves to; a path is
			// decided here already when the platform's roots are known.
			if err := s.checkExecutable(command); err != nil {
				v = append(v, apierror.FieldViolation{Field: "transport.stdio.command", Description: err.Detail})
				refuse(err.Reason)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(k.Stdio.GetEnv())) {
			if name == "" || strings.ContainsAny(name, "=\x00") {
				v = append(v, apierror.FieldViolation{Field: "transport.stdio.env", Description: fmt.Sprintf("invalid environment variable name %q", name)})
				continue
			}
			if err := reach.CheckEnvName(name); err != nil {
				re, _ := reach.AsError(err)
				v = append(v, apierror.FieldViolation{Field: "transport.stdio.env", Description: re.Detail})
				refuse(re.Reason)
			}
			// The value is never echoed: it may be the secret.
			if redact.SecretSetting(name, k.Stdio.GetEnv()[name]) {
				v = append(v, apierror.FieldViolation{Field: "transport.stdio.env",
					Description: fmt.Sprintf("variable %s holds what looks like a literal secret; secrets are never stored in a connection: "+
						"put it in a file in the connection's credential directory (e.g. its mounted Kubernetes Secret) and set credential_ref to \"file:<name>\" (the server receives it as V0M3_CREDENTIAL)", name)})
				refuse(ReasonSecretInEnv)
			}
		}
		// The same rule for arguments; the value is never echoed either.
		for _, i := range redact.SecretArgs(k.Stdio.GetArgs()) {
			v = append(v, apierror.FieldViolation{Field: fmt.Sprintf("transport.stdio.args[%d]", i),
				Description: fmt.Sprintf("argument %d holds what looks like a literal secret; arguments are visible to every process on the host and "+
					"secrets are never stored in a connection: put it in a file (e.g. a mounted Kubernetes Secret) and set credential_ref to \"file:/path\" "+
					"(the server receives it as V0M3_CREDENTIAL)", i)})
			refuse(ReasonSecretInArgs)
		}
	case *registryv1.Transport_StreamableHttp:
		if err := checkHTTPURL(k.StreamableHttp.GetUrl()); err != nil {
			v = append(v, apierror.FieldViolation{Field: "transport.streamable_http.url", Description: err.Error()})
		} else if err := s.reachPolicy().CheckURL(k.StreamableHttp.GetUrl()); err != nil {
			re, _ := reach.AsError(err)
			v = append(v, apierror.FieldViolation{Field: "transport.streamable_http.url", Description: re.Detail})
			refuse(re.Reason)
		}
		if ov := validateOAuth(k.StreamableHttp.GetOauth(), credentialRef); len(ov) > 0 {
			v = append(v, ov...)
			refuse(ReasonInvalidOAuth)
		}
	case *registryv1.Transport_Direct:
		if strings.TrimSpace(k.Direct.GetAdapter()) == "" {
			v = append(v, apierror.FieldViolation{Field: "transport.direct.adapter", Description: "the direct adapter name is required"})
		}
	}
	if credentialRef != "" {
		if p := credentialRefProblem(credentialRef); p != "" {
			v = append(v, apierror.FieldViolation{Field: "credential_ref", Description: p})
		}
	}
	return v, reason
}

func checkHTTPURL(raw string) error {
	if raw == "" {
		return errors.New("an http or https endpoint URL is required")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("not a URL: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("scheme must be http or https, not %q", u.Scheme)
	}
	if u.Host == "" {
		return errors.New("the URL has no host")
	}
	if u.User != nil {
		return errors.New("the URL must not carry user information; use credential_ref")
	}
	return nil
}

// resolveTransport returns a copy of t with its output-only fields set by
// the registry: for stdio, the digest of the executable it resolves to.
func (s *Server) resolveTransport(ctx context.Context, t *registryv1.Transport) *registryv1.Transport {
	t = proto.CloneOf(t)
	if st := t.GetStdio(); st != nil {
		st.ExecutableDigest = ""
		d, err := executableDigest(st.GetCommand())
		if err != nil {
			// The adapter may run on another host; the digest is evidence
			// where available, not a precondition.
			s.log.DebugContext(ctx, "executable digest unavailable", "command", st.GetCommand(), "error", err)
		}
		st.ExecutableDigest = d
	}
	return t
}

// executableDigest returns the SHA-256 of the file command resolves to.
func executableDigest(command string) (string, error) {
	path, err := exec.LookPath(command)
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", command, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return digest.Prefix + hex.EncodeToString(h.Sum(nil)), nil
}

// configDigest is the digest of a connection's canonical configuration:
// everything whose change must send its mappings back to review.
func configDigest(c *registryv1.Connection) (string, error) {
	t, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(c.GetTransport())
	if err != nil {
		return "", fmt.Errorf("encode transport: %w", err)
	}
	return digest.JSON(map[string]any{
		"transport":          json.RawMessage(t),
		"image_digest":       c.GetImageDigest(),
		"credential_ref":     c.GetCredentialRef(),
		"credential_version": c.GetCredentialVersion(),
		"credential_scope":   c.GetCredentialScope(),
		"workload_digest":    c.GetWorkloadDigest(),
	})
}

// reviewedConfig is the part of a connection's configuration a review
// accepts about what runs (executable, arguments, environment, executable
// digest, image, workload) and what is reached (endpoint, direct adapter).
// Where the credential is read is decided by reviewedConfigChanged; its
// version and declared scope are not reviewed: a new version of the same
// reference is a rotation.
func reviewedConfig(c *registryv1.Connection) *registryv1.Connection {
	return &registryv1.Connection{Transport: withoutSecretRef(c.GetTransport()), ImageDigest: c.GetImageDigest(), WorkloadDigest: c.GetWorkloadDigest()}
}

// reviewedConfigChanged reports whether next changes what a review of prev
// accepted: what runs or is reached, or a credential reference
// (credential_ref, the OAuth client secret's) that names a secret the
// review did not see. A new reference hands the server another secret, so
// a second person approves it before the adapter ever reads it. Dropping
// a reference reads nothing and needs no review.
func reviewedConfigChanged(prev, next *registryv1.Connection) bool {
	moved := func(was, is string) bool { return is != "" && is != was }
	return !proto.Equal(reviewedConfig(prev), reviewedConfig(next)) ||
		moved(prev.GetCredentialRef(), next.GetCredentialRef()) ||
		moved(prev.GetTransport().GetStreamableHttp().GetOauth().GetClientSecretRef(), next.GetTransport().GetStreamableHttp().GetOauth().GetClientSecretRef())
}

// withoutSecretRef returns t without the OAuth client secret's reference,
// which reviewedConfigChanged compares on its own.
func withoutSecretRef(t *registryv1.Transport) *registryv1.Transport {
	if t.GetStreamableHttp().GetOauth().GetClientSecretRef() == "" {
		return t
	}
	t = proto.CloneOf(t)
	t.GetStreamableHttp().GetOauth().ClientSecretRef = ""
	return t
}

// actor is how a record names who acted (identity.Caller.Principal): a
// person's or product service's verified id, or the SPIFFE URI of a V0M3
// service, which no person's id can be mistaken for.
func actor(c identity.Caller) string { return c.Principal() }

func configRevisionOf(c *registryv1.Connection, reason string, now *timestamppb.Timestamp) *registryv1.ConfigRevision {
	return &registryv1.ConfigRevision{
		ConnectionId:      c.GetId(),
		Revision:          c.GetConfigRevision(),
		ConfigDigest:      c.GetConfigDigest(),
		Transport:         proto.CloneOf(c.GetTransport()),
		ImageDigest:       c.GetImageDigest(),
		CredentialScope:   c.GetCredentialScope(),
		CredentialRef:     c.GetCredentialRef(),
		CredentialVersion: c.GetCredentialVersion(),
		WorkloadDigest:    c.GetWorkloadDigest(),
		Reason:            reason,
		CreateTime:        now,
		CreatedBy:         c.GetProposedBy(),
	}
}

func transportKind(t *registryv1.Transport) string {
	switch t.GetKind().(type) {
	case *registryv1.Transport_Stdio:
		return "stdio"
	case *registryv1.Transport_StreamableHttp:
		return "streamable_http"
	case *registryv1.Transport_Direct:
		return "direct"
	}
	return "none"
}
