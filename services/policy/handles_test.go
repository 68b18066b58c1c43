package policy

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/v0m3/v0m3/internal/apierror"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

const (
	publicTarget  = "notes://library/api-migration-guide"
	privateTarget = "notes://private/salary-review"
)

// task1Scope is the source scope task_1 is registered with.
var task1Scope = []string{publicTarget, privateTarget}

// registerTask1 registers task_1 for alice with task1Scope; registering it
// again is a no-op.
func registerTask1(t *testing.T, e *env) {
	t.Helper()
	if _, err := e.client.RegisterTask(context.Background(), &policyv1.RegisterTaskRequest{
		TaskId: "task_1", Requester: "alice", SourceScope: task1Scope,
	}); err != nil {
		t.Fatalf("RegisterTask: %v", err)
	}
}

func mint(t *testing.T, e *env, target string, ttl *durationpb.Duration) *policyv1.Handle {
	t.Helper()
	registerTask1(t, e)
	h, err := e.client.MintHandle(context.Background(), &policyv1.MintHandleRequest{
		TaskId: "task_1", Requester: "alice", Capability: capRetrieve, Target: target,
		Label: "note: API migration guide", MappingId: mapRetrieve, MappingRevision: 2, Ttl: ttl,
	})
	if err != nil {
		t.Fatalf("MintHandle: %v", err)
	}
	return h
}

// resolveReq is a resolution that matches a handle minted by mint.
func resolveReq(token string) *policyv1.ResolveHandleRequest {
	return &policyv1.ResolveHandleRequest{
		Token: token, TaskId: "task_1", Requester: alice(), Capability: capRetrieve,
		MappingId: mapRetrieve, MappingRevision: 2, Purpose: "source_review",
	}
}

func TestMintHandle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})

	h := mint(t, e, publicTarget, nil)
	if !strings.HasPrefix(h.GetToken(), "h_") || len(h.GetToken()) < 40 {
		t.Errorf("token %q is not an opaque h_ token", h.GetToken())
	}
	for _, part := range []string{publicTarget, "notes", "library", "api-migration", "guide"} {
		if strings.Contains(strings.ToLower(h.GetToken()), part) {
			t.Errorf("token %q contains %q from the target", h.GetToken(), part)
		}
	}
	if h.GetLabel() != "note: API migration guide" {
		t.Errorf("label = %q", h.GetLabel())
	}
	if got, want := h.GetExpireTime().AsTime(), e.clock.Now().Add(15*time.Minute); !got.Equal(want) {
		t.Errorf("default expiry = %v, want %v", got, want)
	}
	if other := mint(t, e, publicTarget, nil); other.GetToken() == h.GetToken() {
		t.Error("two handles for the same target share a token")
	}
	if h := mint(t, e, publicTarget, durationpb.New(24*time.Hour)); !h.GetExpireTime().AsTime().Equal(e.clock.Now().Add(24 * time.Hour)) {
		t.Errorf("24h expiry = %v", h.GetExpireTime().AsTime())
	}

	bad := []struct {
		name   string
		mutate func(*policyv1.MintHandleRequest)
		field  string
	}{
		{"ttl over 24h", func(r *policyv1.MintHandleRequest) { r.Ttl = durationpb.New(24*time.Hour + time.Second) }, "ttl"},
		{"negative ttl", func(r *policyv1.MintHandleRequest) { r.Ttl = durationpb.New(-time.Minute) }, "ttl"},
		{"no task", func(r *policyv1.MintHandleRequest) { r.TaskId = "" }, "task_id"},
		{"no requester", func(r *policyv1.MintHandleRequest) { r.Requester = "" }, "requester"},
		{"no capability", func(r *policyv1.MintHandleRequest) { r.Capability = "" }, "capability"},
		{"no target", func(r *policyv1.MintHandleRequest) { r.Target = "" }, "target"},
		{"no mapping", func(r *policyv1.MintHandleRequest) { r.MappingId = "" }, "mapping_id"},
		{"no mapping revision", func(r *policyv1.MintHandleRequest) { r.MappingRevision = 0 }, "mapping_revision"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := &policyv1.MintHandleRequest{
				TaskId: "task_1", Requester: "alice", Capability: capRetrieve, Target: publicTarget,
				MappingId: mapRetrieve, MappingRevision: 2,
			}
			tc.mutate(req)
			_, err := e.client.MintHandle(context.Background(), req)
			if apierror.Code(err) != codes.InvalidArgument || !slices.Equal(apierror.Fields(err), []string{tc.field}) {
				t.Fatalf("err = %v (fields %v), want INVALID_ARGUMENT on %s", err, apierror.Fields(err), tc.field)
			}
		})
	}
}

func TestResolveHandle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	h := mint(t, e, publicTarget, nil)
	resp, err := e.client.ResolveHandle(context.Background(), resolveReq(h.GetToken()))
	if err != nil {
		t.Fatalf("ResolveHandle: %v", err)
	}
	b := resp.GetBinding()
	if b.GetTarget() != publicTarget || b.GetTaskId() != "task_1" || b.GetRequester() != "alice" ||
		b.GetCapability() != capRetrieve || b.GetMappingId() != mapRetrieve || b.GetMappingRevision() != 2 {
		t.Errorf("binding = %v", b)
	}
	a := resp.GetAuthorization()
	if a.GetDecision() != policyv1.Decision_DECISION_ALLOW || !slices.Equal(a.GetReasons(), []string{"retrieval-for-review-and-rewrite"}) ||
		a.GetPolicyRevision() == "" || a.GetApprovalRequired() {
		t.Errorf("authorization = %v", a)
	}
	// A handle is reusable within its task until it expires.
	if _, err := e.client.ResolveHandle(context.Background(), resolveReq(h.GetToken())); err != nil {
		t.Errorf("second resolve: %v", err)
	}
	if logs := e.logs.String(); strings.Contains(logs, "api-migration-guide") || strings.Contains(logs, h.GetToken()) {
		t.Errorf("logs contain the target or the full token:\n%s", logs)
	}
}

// checkRefusal asserts code and reason, and that nothing in the error names
// the target or more than a prefix of the token.
func checkRefusal(t *testing.T, err error, code codes.Code, reason, token string) {
	t.Helper()
	if !apierror.Is(err, code, reason) {
		t.Fatalf("err = %v, want %v %s", err, code, reason)
	}
	all := status.Convert(err).Message()
	for k, v := range apierror.Info(err).GetMetadata() {
		all += " " + k + "=" + v
	}
	for _, secret := range []string{publicTarget, privateTarget, "salary", "api-migration", token[:12]} {
		if strings.Contains(all, secret) {
			t.Errorf("error %q reveals %q", all, secret)
		}
	}
}

func TestResolveHandleRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	h := mint(t, e, publicTarget, nil)
	tok := h.GetToken()

	tests := []struct {
		name   string
		mutate func(*policyv1.ResolveHandleRequest)
		code   codes.Code
		reason string
	}{
		{"unknown token", func(r *policyv1.ResolveHandleRequest) { r.Token = "h_" + strings.Repeat("a", 52) }, codes.NotFound, "HANDLE_UNKNOWN"},
		{"guessed target as token", func(r *policyv1.ResolveHandleRequest) { r.Token = publicTarget }, codes.NotFound, "HANDLE_UNKNOWN"},
		{"other task", func(r *policyv1.ResolveHandleRequest) { r.TaskId = "task_2" }, codes.PermissionDenied, "HANDLE_TASK_MISMATCH"},
		{"other requester", func(r *policyv1.ResolveHandleRequest) { r.Requester = bob() }, codes.PermissionDenied, "HANDLE_REQUESTER_MISMATCH"},
		{"other capability", func(r *policyv1.ResolveHandleRequest) { r.Capability = capSearch }, codes.PermissionDenied, "HANDLE_CAPABILITY_MISMATCH"},
		{"other mapping revision", func(r *policyv1.ResolveHandleRequest) { r.MappingRevision = 3 }, codes.FailedPrecondition, "HANDLE_MAPPING_CHANGED"},
		{"other mapping", func(r *policyv1.ResolveHandleRequest) { r.MappingId = "map_other" }, codes.FailedPrecondition, "HANDLE_MAPPING_CHANGED"},
		{"policy denies the purpose", func(r *policyv1.ResolveHandleRequest) { r.Purpose = "publish" }, codes.PermissionDenied, "POLICY_DENIED"},
		{"a source handle where a destination is expected", func(r *policyv1.ResolveHandleRequest) {
			r.Kind = registryv1.HandleKind_HANDLE_KIND_DESTINATION
		}, codes.PermissionDenied, "HANDLE_KIND_MISMATCH"},
		{"a source handle where an artifact is expected", func(r *policyv1.ResolveHandleRequest) {
			r.Kind = registryv1.HandleKind_HANDLE_KIND_ARTIFACT
		}, codes.PermissionDenied, "HANDLE_KIND_MISMATCH"},
		{"a source field takes a handle minted with no kind", func(r *policyv1.ResolveHandleRequest) {
			r.Kind = registryv1.HandleKind_HANDLE_KIND_SOURCE
			r.Purpose = "publish" // reaches re-authorization: the kind matched
		}, codes.PermissionDenied, "POLICY_DENIED"},
		{"kind is checked before capability", func(r *policyv1.ResolveHandleRequest) {
			r.Kind, r.Capability = registryv1.HandleKind_HANDLE_KIND_DESTINATION, capSearch
		}, codes.PermissionDenied, "HANDLE_KIND_MISMATCH"},
		{"task is checked before requester", func(r *policyv1.ResolveHandleRequest) {
			r.TaskId, r.Requester = "task_2", bob()
		}, codes.PermissionDenied, "HANDLE_TASK_MISMATCH"},
		{"requester is checked before capability", func(r *policyv1.ResolveHandleRequest) {
			r.Requester, r.Capability = bob(), capSearch
		}, codes.PermissionDenied, "HANDLE_REQUESTER_MISMATCH"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := resolveReq(tok)
			tc.mutate(req)
			_, err := e.client.ResolveHandle(context.Background(), req)
			checkRefusal(t, err, tc.code, tc.reason, tok)
		})
	}

	t.Run("missing fields", func(t *testing.T) {
		t.Parallel()
		_, err := e.client.ResolveHandle(context.Background(), &policyv1.ResolveHandleRequest{Token: tok})
		want := []string{"capability", "mapping_id", "mapping_revision", "requester.id", "task_id"}
		if apierror.Code(err) != codes.InvalidArgument || !slices.Equal(apierror.Fields(err), want) {
			t.Fatalf("err = %v (fields %v), want INVALID_ARGUMENT on %v", err, apierror.Fields(err), want)
		}
	})
}

func TestResolveHandleExpired(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	h := mint(t, e, publicTarget, durationpb.New(5*time.Minute))

	e.clock.Advance(5*time.Minute - time.Nanosecond)
	if _, err := e.client.ResolveHandle(context.Background(), resolveReq(h.GetToken())); err != nil {
		t.Fatalf("just before expiry: %v", err)
	}
	e.clock.Advance(time.Nanosecond)
	_, err := e.client.ResolveHandle(context.Background(), resolveReq(h.GetToken()))
	checkRefusal(t, err, codes.FailedPrecondition, "HANDLE_EXPIRED", h.GetToken())

	// Identity checks come before expiry: another task learns nothing more.
	req := resolveReq(h.GetToken())
	req.TaskId = "task_2"
	_, err = e.client.ResolveHandle(context.Background(), req)
	checkRefusal(t, err, codes.PermissionDenied, "HANDLE_TASK_MISMATCH", h.GetToken())
}

func TestResolveHandleMappingChangedInRegistry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	ctx := context.Background()
	h := mint(t, e, publicTarget, nil)

	// The remote tool changed: the mapping now needs review.
	e.reg.putMapping(mapRetrieve, capRetrieve, connOK, 2, registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED)
	_, err := e.client.ResolveHandle(ctx, resolveReq(h.GetToken()))
	checkRefusal(t, err, codes.FailedPrecondition, "HANDLE_MAPPING_CHANGED", h.GetToken())

	// A new revision was reviewed: the old handle is still bound to revision 2.
	e.reg.putMapping(mapRetrieve, capRetrieve, connOK, 3, registryv1.MappingState_MAPPING_STATE_ACTIVE)
	_, err = e.client.ResolveHandle(ctx, resolveReq(h.GetToken()))
	checkRefusal(t, err, codes.FailedPrecondition, "HANDLE_MAPPING_CHANGED", h.GetToken())
	req := resolveReq(h.GetToken())
	req.MappingRevision = 3
	_, err = e.client.ResolveHandle(ctx, req)
	checkRefusal(t, err, codes.FailedPrecondition, "HANDLE_MAPPING_CHANGED", h.GetToken())
}

// A policy can scope sources by their connection and forbid single
// targets; resolution re-authorizes the target itself.
const sourcePolicy = `@id("conn-ok-sources")
permit (principal, action == V0M3::Action::"retrieve_authorized_source", resource in V0M3::Connection::"conn_ok");

@id("no-private-notes")
forbid (principal, action, resource == V0M3::Source::"notes://private/salary-review");
`

func TestResolveHandleReauthorizesTarget(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "policy.cedar")
	writePolicy(t, path, sourcePolicy)
	e := newEnv(t, options{policyFile: path})
	ctx := context.Background()

	pub := mint(t, e, publicTarget, nil)
	resp, err := e.client.ResolveHandle(ctx, resolveReq(pub.GetToken()))
	if err != nil {
		t.Fatalf("public note: %v", err)
	}
	if got := resp.GetAuthorization().GetReasons(); !slices.Equal(got, []string{"conn-ok-sources"}) {
		t.Errorf("reasons = %v, want the connection-scoped permit", got)
	}

	priv := mint(t, e, privateTarget, nil)
	_, err = e.client.ResolveHandle(ctx, resolveReq(priv.GetToken()))
	checkRefusal(t, err, codes.PermissionDenied, "POLICY_DENIED", priv.GetToken())
	if logs := e.logs.String(); strings.Contains(logs, "salary") {
		t.Errorf("logs reveal the private target:\n%s", logs)
	}

	// The same source through a mapping on another connection: the
	// scoping permit does not match. (A mapping never moves to another
	// connection: the registry makes that a new mapping.)
	e.reg.addConnection("conn_other", registryv1.ConnectionState_CONNECTION_STATE_ACTIVE)
	e.reg.putMapping("map_other", capRetrieve, "conn_other", 1, registryv1.MappingState_MAPPING_STATE_ACTIVE)
	other, err := e.client.MintHandle(ctx, &policyv1.MintHandleRequest{
		TaskId: "task_1", Requester: "alice", Capability: capRetrieve, Target: publicTarget,
		Label: "note: API migration guide", MappingId: "map_other", MappingRevision: 1,
	})
	if err != nil {
		t.Fatalf("MintHandle: %v", err)
	}
	req := resolveReq(other.GetToken())
	req.MappingId, req.MappingRevision = "map_other", 1
	_, err = e.client.ResolveHandle(ctx, req)
	checkRefusal(t, err, codes.PermissionDenied, "POLICY_DENIED", other.GetToken())
}

// bindingReads counts the handle binding reads that reach the store.
type bindingReads struct {
	Store
	n atomic.Int64
}

func (r *bindingReads) GetHandle(ctx context.Context, key string) (*policyv1.HandleBinding, error) {
	r.n.Add(1)
	return r.Store.GetHandle(ctx, key)
}

// A handle's binding never changes once minted, so resolving it again
// does not read the store again; a token not found is read each time (it
// may be minted meanwhile through another replica), and the kept binding
// still expires (TestResolveHandleExpired).
func TestHandleBindingReadOnce(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, opts options) {
		reads := &bindingReads{}
		opts.wrap = func(st Store) Store { reads.Store = st; return reads }
		e := newEnv(t, opts)
		ctx := context.Background()
		h := mint(t, e, publicTarget, nil)
		for range 3 {
			if _, err := e.client.ResolveHandle(ctx, resolveReq(h.GetToken())); err != nil {
				t.Fatalf("ResolveHandle: %v", err)
			}
		}
		if got := reads.n.Load(); got != 1 {
			t.Errorf("three resolutions of one handle read its binding %d times, want 1", got)
		}

		// Well formed, one letter off: no handle has this token.
		last := "a"
		if strings.HasSuffix(h.GetToken(), "a") {
			last = "b"
		}
		unknown := h.GetToken()[:len(h.GetToken())-1] + last
		for range 2 {
			_, err := e.client.ResolveHandle(ctx, resolveReq(unknown))
			checkRefusal(t, err, codes.NotFound, "HANDLE_UNKNOWN", unknown)
		}
		if got := reads.n.Load(); got != 3 {
			t.Errorf("two resolutions of an unknown handle read the store %d times, want 2 (not kept)", got-1)
		}
	})
}
