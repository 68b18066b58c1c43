package policy

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/handlekind"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// storedHandles counts the handles in e's store (by sweeping everything
// that expires before the far future: the store has no other listing).
func storedHandles(t *testing.T, e *env) int {
	t.Helper()
	n, err := e.srv.store.DeleteExpiredHandles(context.Background(), time.Now().AddDate(100, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRegisterTask(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	ctx := context.Background()
	first, err := e.client.RegisterTask(ctx, &policyv1.RegisterTaskRequest{
		TaskId: "task_7", Requester: "alice", SourceScope: []string{privateTarget, publicTarget}})
	if err != nil {
		t.Fatal(err)
	}
	if first.GetTaskId() != "task_7" || first.GetRequester() != "alice" || first.GetRegisterTime() == nil ||
		!slices.Equal(first.GetSourceScope(), []string{publicTarget, privateTarget}) {
		t.Errorf("registered %v", first)
	}
	// A retry (in any order) is answered with the record.
	again, err := e.client.RegisterTask(ctx, &policyv1.RegisterTaskRequest{
		TaskId: "task_7", Requester: "alice", SourceScope: []string{publicTarget, privateTarget}})
	if err != nil || !again.GetRegisterTime().AsTime().Equal(first.GetRegisterTime().AsTime()) {
		t.Errorf("retry = %v, %v; want the first record", again, err)
	}

	// Nothing replaces a registered scope.
	for _, change := range []*policyv1.RegisterTaskRequest{
		{TaskId: "task_7", Requester: "mallory", SourceScope: []string{publicTarget, privateTarget}},
		{TaskId: "task_7", Requester: "alice", SourceScope: []string{publicTarget, privateTarget, "notes://private/board-minutes"}},
		{TaskId: "task_7", Requester: "alice", SourceScope: []string{publicTarget}},
	} {
		_, err := e.client.RegisterTask(ctx, change)
		if !apierror.Is(err, codes.AlreadyExists, "TASK_ALREADY_REGISTERED") {
			t.Errorf("re-register %v: err = %v, want ALREADY_EXISTS TASK_ALREADY_REGISTERED", change, err)
		}
	}
	stored, err := e.srv.store.GetTaskScope(ctx, "task_7")
	if err != nil || stored.GetRequester() != "alice" || !slices.Equal(stored.GetSourceScope(), first.GetSourceScope()) {
		t.Errorf("stored scope %v, %v; want the first registration", stored, err)
	}

	bad := []struct {
		name  string
		req   *policyv1.RegisterTaskRequest
		field string
	}{
		{"no task", &policyv1.RegisterTaskRequest{Requester: "alice"}, "task_id"},
		{"no requester", &policyv1.RegisterTaskRequest{TaskId: "task_8"}, "requester"},
		{"empty target", &policyv1.RegisterTaskRequest{TaskId: "task_8", Requester: "alice", SourceScope: []string{publicTarget, ""}}, "source_scope[1]"},
		{"duplicate target", &policyv1.RegisterTaskRequest{TaskId: "task_8", Requester: "alice", SourceScope: []string{publicTarget, publicTarget}}, "source_scope[1]"},
		{"duplicate artifact", &policyv1.RegisterTaskRequest{TaskId: "task_8", Requester: "alice", ArtifactScope: []string{"artifact://a", "artifact://a"}}, "artifact_scope[1]"},
		{"empty destination", &policyv1.RegisterTaskRequest{TaskId: "task_8", Requester: "alice", DestinationScope: []string{""}}, "destination_scope[0]"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.RegisterTask(ctx, tc.req)
			if !apierror.Is(err, codes.InvalidArgument, "FIELD_INVALID") || !slices.Equal(apierror.Fields(err), []string{tc.field}) {
				t.Errorf("err = %v (fields %v), want INVALID_ARGUMENT on %s", err, apierror.Fields(err), tc.field)
			}
		})
	}
	if _, err := e.srv.store.GetTaskScope(ctx, "task_8"); err == nil {
		t.Error("an invalid registration was stored")
	}
}

// TestMintHandleOnlyInScope: a handle is minted only for a registered
// task's requester and a target in its source scope; a refusal stores
// nothing.
func TestMintHandleOnlyInScope(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	if _, err := e.client.RegisterTask(context.Background(), &policyv1.RegisterTaskRequest{
		TaskId: "task_1", Requester: "alice", SourceScope: []string{publicTarget}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		mutate     func(*policyv1.MintHandleRequest)
		wantCode   codes.Code
		wantReason string
	}{
		{"target outside the scope", func(r *policyv1.MintHandleRequest) { r.Target = privateTarget }, codes.PermissionDenied, "HANDLE_TARGET_OUT_OF_SCOPE"},
		{"target that only shares a prefix", func(r *policyv1.MintHandleRequest) { r.Target = publicTarget + "/../salary-review" }, codes.PermissionDenied, "HANDLE_TARGET_OUT_OF_SCOPE"},
		{"another requester", func(r *policyv1.MintHandleRequest) { r.Requester = "mallory" }, codes.PermissionDenied, "TASK_REQUESTER_MISMATCH"},
		{"unregistered task", func(r *policyv1.MintHandleRequest) { r.TaskId = "task_unknown" }, codes.FailedPrecondition, "TASK_NOT_REGISTERED"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := &policyv1.MintHandleRequest{TaskId: "task_1", Requester: "alice", Capability: capRetrieve, Target: publicTarget,
				MappingId: mapRetrieve, MappingRevision: 2}
			tc.mutate(req)
			h, err := e.client.MintHandle(context.Background(), req)
			if !apierror.Is(err, tc.wantCode, tc.wantReason) {
				t.Fatalf("MintHandle = %v, %v; want %v %s", h, err, tc.wantCode, tc.wantReason)
			}
			if strings.Contains(err.Error(), req.GetTarget()) {
				t.Errorf("the refusal names the target: %v", err)
			}
			if n := storedHandles(t, e); n != 0 {
				t.Errorf("a refused mint stored %d handles", n)
			}
		})
	}
	// In scope, for the requester: minted.
	if _, err := e.client.MintHandle(context.Background(), &policyv1.MintHandleRequest{TaskId: "task_1", Requester: "alice",
		Capability: capRetrieve, Target: publicTarget, MappingId: mapRetrieve, MappingRevision: 2}); err != nil {
		t.Fatalf("in-scope mint: %v", err)
	}
	if n := storedHandles(t, e); n != 1 {
		t.Errorf("%d handles stored after one mint, want 1", n)
	}
}

// TestMintHandleByKind: each kind of handle is minted only from the task's
// scope of that kind: a source is not a destination even when the task may
// read it, and a refusal stores nothing.
func TestMintHandleByKind(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	const (
		artifact    = "artifact://previews/sha256:4f2a"
		destination = "site://docs.example/api-migration"
	)
	if _, err := e.client.RegisterTask(context.Background(), &policyv1.RegisterTaskRequest{
		TaskId: "task_1", Requester: "alice", SourceScope: []string{publicTarget},
		ArtifactScope: []string{artifact}, DestinationScope: []string{destination}}); err != nil {
		t.Fatal(err)
	}
	var (
		source = registryv1.HandleKind_HANDLE_KIND_SOURCE
		art    = registryv1.HandleKind_HANDLE_KIND_ARTIFACT
		dest   = registryv1.HandleKind_HANDLE_KIND_DESTINATION
		unset  = registryv1.HandleKind_HANDLE_KIND_UNSPECIFIED
	)
	tests := []struct {
		name   string
		kind   registryv1.HandleKind
		target string
		ok     bool
	}{
		{"source", source, publicTarget, true},
		{"unset kind is a source", unset, publicTarget, true},
		{"artifact", art, artifact, true},
		{"destination", dest, destination, true},
		{"a source as a destination", dest, publicTarget, false},
		{"a destination as a source", source, destination, false},
		{"an artifact as a destination", dest, artifact, false},
		{"a destination as an artifact", art, destination, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			storedHandles(t, e) // sweeps what earlier cases minted
			h, err := e.client.MintHandle(context.Background(), &policyv1.MintHandleRequest{TaskId: "task_1", Requester: "alice",
				Capability: capDeliver, Target: tc.target, MappingId: "map_deliver", MappingRevision: 1, Kind: tc.kind})
			if tc.ok {
				if err != nil {
					t.Fatalf("MintHandle: %v", err)
				}
				b, err := e.srv.store.GetHandle(context.Background(), handleKey(h.GetToken()))
				if err != nil || b.GetKind() != handlekind.Of(tc.kind) {
					t.Fatalf("stored binding %v, %v; want kind %v", b, err, handlekind.Of(tc.kind))
				}
				return
			}
			if !apierror.Is(err, codes.PermissionDenied, "HANDLE_TARGET_OUT_OF_SCOPE") || strings.Contains(err.Error(), tc.target) {
				t.Fatalf("MintHandle = %v, %v; want PERMISSION_DENIED HANDLE_TARGET_OUT_OF_SCOPE not naming the target", h, err)
			}
			if !strings.Contains(err.Error(), handlekind.Name(tc.kind)+" scope") {
				t.Errorf("the refusal does not name the scope: %v", err)
			}
			if n := storedHandles(t, e); n != 0 {
				t.Errorf("a refused mint stored %d handles", n)
			}
		})
	}
	// The scopes are part of the immutable registration: the same again is
	// answered with the record, another destination is refused.
	again, err := e.client.RegisterTask(context.Background(), &policyv1.RegisterTaskRequest{
		TaskId: "task_1", Requester: "alice", SourceScope: []string{publicTarget},
		ArtifactScope: []string{artifact}, DestinationScope: []string{destination}})
	if err != nil || !slices.Equal(again.GetDestinationScope(), []string{destination}) || !slices.Equal(again.GetArtifactScope(), []string{artifact}) {
		t.Errorf("registering again = %v, %v; want the record", again, err)
	}
	_, err = e.client.RegisterTask(context.Background(), &policyv1.RegisterTaskRequest{
		TaskId: "task_1", Requester: "alice", SourceScope: []string{publicTarget},
		ArtifactScope: []string{artifact}, DestinationScope: []string{destination, "site://elsewhere"}})
	if !apierror.Is(err, codes.AlreadyExists, "TASK_ALREADY_REGISTERED") {
		t.Errorf("widening the destination scope: %v, want ALREADY_EXISTS TASK_ALREADY_REGISTERED", err)
	}
	_, err = e.client.MintHandle(context.Background(), &policyv1.MintHandleRequest{TaskId: "task_1", Requester: "alice",
		Capability: capDeliver, Target: destination, MappingId: "map_deliver", MappingRevision: 1, Kind: registryv1.HandleKind(42)})
	if !apierror.Is(err, codes.InvalidArgument, "FIELD_INVALID") || !slices.Equal(apierror.Fields(err), []string{"kind"}) {
		t.Errorf("unknown kind: %v (fields %v)", err, apierror.Fields(err))
	}
}
