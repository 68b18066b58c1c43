package realnode_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/v0m3/v0m3/demo/fixture/renderer"
	"github.com/v0m3/v0m3/demo/scenario"
	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	"github.com/v0m3/v0m3/operator/controller"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// approver approves previews; not alice, whose task it is.
var approver = scenario.Person{ID: "approver@platform", Groups: []string{"approvers"}}

const (
	renderPreview  = "render_preview"
	documentDigest = "sha256:document-31"
)

// callLog reads the JSON lines a fixture in pod appended to /work/calls.jsonl,
// straight from the pod's emptyDir on the node: evidence of what reached the
// pod, independent of anything V0M3 recorded.
func callLog(t *testing.T, pod *corev1.Pod) []map[string]any {
	t.Helper()
	path := filepath.Join(nodeEnv["V0M3_REALNODE_DIR"], "kubelet", "root", "pods", string(pod.UID),
		"volumes", "kubernetes.io~empty-dir", "work", "calls.jsonl")
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if l != "" && json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// errorInfo is err's google.rpc.ErrorInfo, or nil.
func errorInfo(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

func count(log []map[string]any, key, value string) int {
	n := 0
	for _, e := range log {
		if e[key] == value {
			n++
		}
	}
	return n
}

// approveIfPending has the development reviewer approve the server's connection
// at its current config revision, if it waits for review.
func (s *server) approveIfPending() *registryv1.Connection {
	s.t.Helper()
	c := s.connection()
	if c.GetReviewState() == registryv1.ReviewState_REVIEW_STATE_PENDING {
		var err error
		if c, err = services.ApproveConnection(context.Background(), c); err != nil {
			s.t.Fatal(err)
		}
	}
	return c
}

// revision waits for the operator to move the server's connection past
// config revision from, and returns the new revision.
func (s *server) revision(from int64) int64 {
	s.t.Helper()
	var rev int64
	waitFor(s.t, "a config revision after "+itoa(from), time.Minute, func() (bool, string) {
		rev = s.get().Status.ConfigRevision
		return rev > from, "at " + itoa(rev)
	})
	return rev
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// onlyPodsOf waits until every pod of the server runs config revision rev:
// the old ones are gone.
func (s *server) onlyPodsOf(rev int64) {
	s.t.Helper()
	waitFor(s.t, "old pods gone", podTimeout, func() (bool, string) {
		var list corev1.PodList
		if err := k8s.List(s.ctx, &list, client.InNamespace(s.ns), client.MatchingLabels{controller.LabelServer: s.name}); err != nil {
			return false, err.Error()
		}
		var old []string
		for _, p := range list.Items {
			if p.Annotations[controller.AnnotationConfigRevision] != itoa(rev) {
				old = append(old, p.Name+" rev "+p.Annotations[controller.AnnotationConfigRevision])
			}
		}
		return len(old) == 0, strings.Join(old, ", ")
	})
}

// The rest of an MCPServer's life on the node, for the fixture server over
// stdio: a reviewed mapping serves a governed retrieval that reaches the
// pod (the fixture's own call log, read from the pod's volume on the node,
// shows the tools/call); a new server version whose tool description
// changed, rolled out by editing the manifest, makes the mapping need
// review and ReviewRequired True; deleting the MCPServer retires the
// connection while its snapshots, mappings and the task's evidence stay
// readable.
func TestGovernedCallDriftAndRemoval(t *testing.T) {
	t.Parallel()
	needNode(t)
	ns := namespace(t)
	s := stdioServer(t, ns, "sources", "first-token")
	s.edit(func(m *v1alpha1.MCPServer) { m.Spec.Args = append(m.Spec.Args, "--call-log", "/work/calls.jsonl") })
	conn := s.approveIfPending()
	pod := s.runningPod(conn.GetConfigRevision())
	s.resolves(pod)
	integrator := as(scenario.Integrator)
	snap, err := services.Adapter.Discover(integrator, &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	mapping, err := services.Registry.ProposeMapping(integrator, &registryv1.ProposeMappingRequest{
		Capability: scenario.Retrieve, ConnectionId: conn.GetId(), SnapshotId: snap.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search"},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "query", ProductField: "query"},
			{RemoteField: "uri", ProductField: "source", FromHandle: true},
		},
		Limits: &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/markdown"}},
	})
	if err != nil {
		t.Fatalf("ProposeMapping: %v", err)
	}
	if mapping, err = services.Registry.ReviewMapping(as(scenario.Reviewer), &registryv1.ReviewMappingRequest{
		MappingId: mapping.GetId(), Revision: mapping.GetRevision(), Approve: true,
	}); err != nil {
		t.Fatalf("ReviewMapping: %v", err)
	}
	if c := s.condition(v1alpha1.ConditionReviewRequired, metav1.ConditionFalse); c.Reason != v1alpha1.ReasonReviewed {
		t.Errorf("ReviewRequired with an active mapping = %+v; want False/%s", c, v1alpha1.ReasonReviewed)
	}

	// A governed retrieval reaches the pod.
	task, err := services.Orchestrator.StartTask(as(scenario.Alice), &orchestratorv1.StartTaskRequest{
		Profile: "source_review", Purpose: "review the migration FAQ",
		SourceScope: []*orchestratorv1.SourceRef{{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"}},
	})
	if err != nil {
		t.Fatalf("StartTask: %v", err)
	}
	offered := scenario.FindOffered(task.GetCatalogue(), scenario.Retrieve)
	if offered == nil {
		t.Fatalf("%s not offered: %v", scenario.Retrieve, task.GetCatalogue())
	}
	before := count(callLog(t, pod), "method", "tools/call")
	got, err := services.Orchestrator.SubmitToolRequest(as(scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: task.GetTask().GetId(), ProviderCallId: "call-1", Capability: scenario.Retrieve,
		Arguments: scenario.MustStruct(map[string]any{"source": scenario.FindHandle(offered, "Migration FAQ"), "query": "migration"}),
	})
	if err != nil || got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || len(got.GetExcerpts()) == 0 {
		t.Fatalf("governed retrieval: state %v, %d excerpts, err %v; want EXECUTED with excerpts", got.GetState(), len(got.GetExcerpts()), err)
	}
	if after := count(callLog(t, pod), "method", "tools/call"); after != before+1 {
		t.Errorf("tools/call in the pod's call log: %d before, %d after; want one more", before, after)
	}

	// A new server version whose tool describes itself differently.
	s.edit(func(m *v1alpha1.MCPServer) { m.Spec.Args = append(m.Spec.Args, "--description", "private") })
	rev := s.revision(conn.GetConfigRevision())
	conn = s.approveIfPending()
	pod2 := s.runningPod(rev)
	s.onlyPodsOf(rev)
	s.resolves(pod2)
	snap2, err := services.Adapter.Discover(integrator, &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatalf("Discover the new version: %v", err)
	}
	if snap2.GetDigest() == snap.GetDigest() || snap2.GetConfigRevision() != rev {
		t.Fatalf("snapshot of the new version: digest %s (was %s) at revision %d; want a new digest at %d", snap2.GetDigest(), snap.GetDigest(), snap2.GetConfigRevision(), rev)
	}
	now, err := services.Registry.GetMapping(integrator, &registryv1.GetMappingRequest{Id: mapping.GetId()})
	if err != nil || now.GetState() != registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED {
		t.Fatalf("mapping after the description changed: %v %v; want REVIEW_REQUIRED", now.GetState(), err)
	}
	if c := s.condition(v1alpha1.ConditionReviewRequired, metav1.ConditionTrue); c.Reason != v1alpha1.ReasonMappingsNeedReview {
		t.Errorf("ReviewRequired after drift = %+v; want True/%s", c, v1alpha1.ReasonMappingsNeedReview)
	}

	// Removal retires the connection; what was recorded stays readable.
	if err := k8s.Delete(s.ctx, s.get()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the MCPServer gone", time.Minute, func() (bool, string) {
		err := k8s.Get(s.ctx, client.ObjectKey{Namespace: ns, Name: s.name}, &v1alpha1.MCPServer{})
		return apierrors.IsNotFound(err), "still there"
	})
	retired, err := services.Registry.GetConnection(integrator, &registryv1.GetConnectionRequest{Id: conn.GetId()})
	if err != nil || retired.GetState() != registryv1.ConnectionState_CONNECTION_STATE_RETIRED {
		t.Fatalf("connection after the MCPServer was deleted: %v %v; want RETIRED and readable", retired.GetState(), err)
	}
	for _, id := range []string{snap.GetId(), snap2.GetId()} {
		if _, err := services.Registry.GetSnapshot(integrator, &registryv1.GetSnapshotRequest{Id: id}); err != nil {
			t.Errorf("snapshot %s after retirement: %v", id, err)
		}
	}
	if _, err := services.Registry.GetMapping(integrator, &registryv1.GetMappingRequest{Id: mapping.GetId()}); err != nil {
		t.Errorf("mapping after retirement: %v", err)
	}
	old, err := services.Orchestrator.GetRequest(as(scenario.Alice), &orchestratorv1.GetRequestRequest{Id: got.GetId()})
	if err != nil || old.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || len(old.GetExcerpts()) == 0 {
		t.Errorf("the executed request after retirement: %v %v; want it readable with its excerpts", old.GetState(), err)
	}
	waitFor(t, "the server's pods gone", podTimeout, func() (bool, string) {
		var list corev1.PodList
		if err := k8s.List(s.ctx, &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, itoa(int64(len(list.Items))) + " pods"
	})
}

// Rotating the referenced Secret on the node: the operator records a new
// config revision, the Deployment rolls to a pod started for it, and an
// approval given under the old revision is refused naming the credentials
// binding, having rendered nothing; a request approved after the rotation
// executes in the new pod. The renderer runs over stdio through the bridge.
func TestRotationRollsPodsAndInvalidatesApprovals(t *testing.T) {
	t.Parallel()
	needNode(t)
	ns := namespace(t)
	secret(t, ns, "renderer-token", "token-1")
	limit := resource.MustParse("32Mi")
	s := apply(t, &v1alpha1.MCPServer{
		ObjectMeta: metav1.ObjectMeta{Name: "renderer", Namespace: ns},
		Spec: v1alpha1.MCPServerSpec{
			Image:     fixtureImage,
			Transport: v1alpha1.TransportSpec{Type: v1alpha1.TransportStdio},
			Command:   []string{fixturePath},
			Args:      []string{"fixture-renderer", "--transport", "stdio", "--work-dir", "/work/render", "--call-log", "/work/calls.jsonl"},
			Credentials: &v1alpha1.CredentialsSpec{
				SecretRef: v1alpha1.SecretKeyRef{Name: "renderer-token", Key: "token"},
				Scope:     "local renderer; no credential",
			},
			Sandbox: v1alpha1.SandboxSpec{WorkDirSizeLimit: &limit},
			Owner:   "team-docs",
		},
	})
	conn := s.approveIfPending()
	pod := s.runningPod(conn.GetConfigRevision())
	s.resolves(pod)
	integrator := as(scenario.Integrator)
	snap, err := services.Adapter.Discover(integrator, &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	mapping, err := services.Registry.ProposeMapping(integrator, &registryv1.ProposeMappingRequest{
		Capability: renderPreview, ConnectionId: conn.GetId(), SnapshotId: snap.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: renderer.ToolRender},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "document_revision", ProductField: "document_revision"},
			{RemoteField: "profile", ProductField: "profile"},
		},
		Limits:              &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 4, AllowedMediaTypes: []string{"text/plain"}},
		IdempotencyKeyField: "request_id",
		StatusTool:          renderer.ToolStatus,
	})
	if err != nil {
		t.Fatalf("ProposeMapping: %v", err)
	}
	if _, err := services.Registry.ReviewMapping(as(scenario.Reviewer), &registryv1.ReviewMappingRequest{
		MappingId: mapping.GetId(), Revision: mapping.GetRevision(), Approve: true,
	}); err != nil {
		t.Fatalf("ReviewMapping: %v", err)
	}
	task, err := services.Orchestrator.StartTask(as(scenario.Alice), &orchestratorv1.StartTaskRequest{
		Profile: "preview", Purpose: "preview revision 31 before review",
	})
	if err != nil {
		t.Fatalf("StartTask: %v", err)
	}
	submit := func(call string) *orchestratorv1.ToolRequest {
		t.Helper()
		r, err := services.Orchestrator.SubmitToolRequest(as(scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
			TaskId: task.GetTask().GetId(), ProviderCallId: call, Capability: renderPreview, DocumentDigest: documentDigest,
			Arguments: scenario.MustStruct(map[string]any{"document_revision": 31, "profile": 4}),
		})
		if err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL {
			t.Fatalf("submit preview: %v, %v; want AWAITING_APPROVAL", r.GetState(), err)
		}
		return r
	}
	approve := func(id string) (*orchestratorv1.ToolRequest, error) {
		return services.Orchestrator.Approve(as(approver), &orchestratorv1.ApproveRequest{RequestId: id, DocumentDigest: documentDigest})
	}
	waiting := submit("call-before")

	// Rotate: a new Secret value, the same declared scope.
	var sec corev1.Secret
	if err := k8s.Get(s.ctx, client.ObjectKey{Namespace: ns, Name: "renderer-token"}, &sec); err != nil {
		t.Fatal(err)
	}
	sec.Data = map[string][]byte{"token": []byte("token-2")}
	if err := k8s.Update(s.ctx, &sec); err != nil {
		t.Fatal(err)
	}
	rev := s.revision(conn.GetConfigRevision())
	if got := s.get().Status.CredentialVersion; got != "renderer-token@"+sec.ResourceVersion {
		t.Errorf("status credential version %q; want the rotated Secret's renderer-token@%s", got, sec.ResourceVersion)
	}
	// A rotation within the declared scope keeps the connection approved
	// (the registry's rule); were it pending, no pod of it would start.
	if c := s.connection(); c.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_APPROVED || c.GetConfigRevision() != rev {
		t.Fatalf("connection after a rotation within scope: %v at revision %d; want approved at %d", c.GetReviewState(), c.GetConfigRevision(), rev)
	}
	pod2 := s.runningPod(rev)
	s.onlyPodsOf(rev)
	if pod2.UID == pod.UID {
		t.Fatal("the rotation did not start a new pod")
	}
	waitFor(t, "the rotation recorded complete and its revision serving", 2*time.Minute, func() (bool, string) {
		got := s.get().Status
		return got.Rotation != nil && got.Rotation.CompletionTime != nil && got.Rotation.ToRevision == rev && got.ServingConfigRevision == rev,
			"rotation status not complete or revision " + itoa(got.ServingConfigRevision) + " serving"
	})
	if c := s.connection(); c.GetServingConfigRevision() != rev {
		t.Fatalf("registry serves revision %d after the rollout, want %d", c.GetServingConfigRevision(), rev)
	}
	s.resolves(pod2)

	_, err = approve(waiting.GetId())
	if info := errorInfo(err); status.Code(err) != codes.FailedPrecondition || info.GetReason() != "APPROVAL_INVALIDATED" || info.GetMetadata()["binding"] != "credentials" {
		t.Fatalf("approving a request submitted under the old revision: %v; want APPROVAL_INVALIDATED naming credentials", err)
	}
	if n := count(callLog(t, pod2), "event", "rendered"); n != 0 {
		t.Fatalf("an invalidated approval rendered %d times", n)
	}
	done, err := approve(submit("call-after").GetId())
	if err != nil || done.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("a preview approved after the rotation: %v, %v; want EXECUTED", done.GetState(), err)
	}
	if n := count(callLog(t, pod2), "event", "rendered"); n != 1 {
		t.Errorf("renders in the new pod = %d; want 1", n)
	}
}
