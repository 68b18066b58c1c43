package realnode_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/v0m3/v0m3/demo/scenario"
	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	"github.com/v0m3/v0m3/operator/controller"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// podTimeout bounds a pod start: scheduling, an image pull from the
// loopback registry and the readiness probe, on a loaded shared machine.
const podTimeout = 3 * time.Minute

// server is one test's MCPServer on the node.
type server struct {
	t    *testing.T
	ctx  context.Context
	ns   string
	name string
}

// stdioServer applies an MCPServer running the fixture server over stdio
// from fixtureImage, which holds neither the bridge nor a libc: the
// operator's init container copies the static v0m3 binary in, and the
// bridge serves the fixture over streamable HTTP.
func stdioServer(t *testing.T, ns, name string, token string) *server {
	t.Helper()
	secret(t, ns, name+"-token", token)
	limit := resource.MustParse("32Mi")
	return apply(t, &v1alpha1.MCPServer{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.MCPServerSpec{
			Image:     fixtureImage,
			Transport: v1alpha1.TransportSpec{Type: v1alpha1.TransportStdio},
			Command:   []string{fixturePath},
			Args:      []string{"fixture-server", "--transport", "stdio"},
			Credentials: &v1alpha1.CredentialsSpec{
				SecretRef: v1alpha1.SecretKeyRef{Name: name + "-token", Key: "token"},
				Scope:     "read-only access to the fixture notes",
				EnvName:   "SEARCH_TOKEN",
			},
			Sandbox: v1alpha1.SandboxSpec{WorkDirSizeLimit: &limit},
			Owner:   "team-sources",
		},
	})
}

// httpServer applies an MCPServer whose image serves streamable HTTP itself.
func httpServer(t *testing.T, ns, name string) *server {
	t.Helper()
	return apply(t, &v1alpha1.MCPServer{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.MCPServerSpec{
			Image:     fixtureImage,
			Transport: v1alpha1.TransportSpec{Type: v1alpha1.TransportStreamableHTTP, Port: 8080, Path: "/mcp"},
			Command:   []string{fixturePath},
			Args:      []string{"fixture-server", "--transport", "http", "--addr", ":8080"},
			Owner:     "team-sources",
		},
	})
}

func secret(t *testing.T, ns, name, token string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, StringData: map[string]string{"token": token}}
	if err := k8s.Create(context.Background(), s); err != nil {
		t.Fatalf("create Secret: %v", err)
	}
}

func apply(t *testing.T, s *v1alpha1.MCPServer) *server {
	t.Helper()
	if err := k8s.Create(context.Background(), s); err != nil {
		t.Fatalf("create MCPServer: %v", err)
	}
	return &server{t: t, ctx: context.Background(), ns: s.Namespace, name: s.Name}
}

func (s *server) get() *v1alpha1.MCPServer {
	s.t.Helper()
	var m v1alpha1.MCPServer
	if err := k8s.Get(s.ctx, client.ObjectKey{Namespace: s.ns, Name: s.name}, &m); err != nil {
		s.t.Fatalf("get MCPServer: %v", err)
	}
	return &m
}

// edit changes the MCPServer's spec as a person would with kubectl edit:
// read, change, write, and on a conflict with the operator's own status
// writes read again and retry.
func (s *server) edit(change func(*v1alpha1.MCPServer)) {
	s.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := s.get()
		change(m)
		return k8s.Update(s.ctx, m)
	})
	if err != nil {
		s.t.Fatalf("edit MCPServer: %v", err)
	}
}

// as is ctx carrying person p's token.
func as(p scenario.Person) context.Context {
	return services.As(context.Background(), p.ID, p.Groups...)
}

// connection waits for the operator to register the server and returns its
// registry connection as the integrator reads it.
func (s *server) connection() *registryv1.Connection {
	s.t.Helper()
	var id string
	waitFor(s.t, "the registry connection", time.Minute, func() (bool, string) {
		id = s.get().Status.ConnectionID
		return id != "", "no connection id in the status"
	})
	c, err := services.Registry.GetConnection(as(scenario.Integrator), &registryv1.GetConnectionRequest{Id: id})
	if err != nil {
		s.t.Fatalf("GetConnection: %v", err)
	}
	return c
}

// runningPod waits for the server's one pod that runs config revision rev
// to be Running and Ready, and returns it.
func (s *server) runningPod(rev int64) *corev1.Pod {
	s.t.Helper()
	var pod *corev1.Pod
	waitFor(s.t, fmt.Sprintf("a Running, Ready pod of config revision %d", rev), podTimeout, func() (bool, string) {
		var list corev1.PodList
		if err := k8s.List(s.ctx, &list, client.InNamespace(s.ns), client.MatchingLabels{controller.LabelServer: s.name}); err != nil {
			return false, err.Error()
		}
		var seen []string
		for i, p := range list.Items {
			seen = append(seen, fmt.Sprintf("%s %s rev=%s %s", p.Name, p.Status.Phase, p.Annotations[controller.AnnotationConfigRevision], waiting(&p)))
			if p.Annotations[controller.AnnotationConfigRevision] == fmt.Sprint(rev) && p.Status.Phase == corev1.PodRunning && ready(&p) && p.DeletionTimestamp == nil {
				pod = &list.Items[i]
				return true, ""
			}
		}
		return false, strings.Join(seen, "; ")
	})
	return pod
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waiting describes why a pod's containers are not running, for failures.
func waiting(p *corev1.Pod) string {
	var why []string
	for _, c := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		if w := c.State.Waiting; w != nil {
			why = append(why, c.Name+": "+w.Reason+" "+w.Message)
		}
		if x := c.State.Terminated; x != nil && x.ExitCode != 0 {
			why = append(why, fmt.Sprintf("%s: exit %d %s", c.Name, x.ExitCode, x.Message))
		}
	}
	return strings.Join(why, ", ")
}

// condition waits for the server's condition typ to have status want, and
// returns it. Nothing nudges the operator: it follows the registry's event
// stream, so a snapshot or a review reaches the condition well within the
// minute this waits, while its own resync is two minutes away.
func (s *server) condition(typ string, want metav1.ConditionStatus) metav1.Condition {
	s.t.Helper()
	var c metav1.Condition
	waitFor(s.t, fmt.Sprintf("condition %s=%s", typ, want), time.Minute, func() (bool, string) {
		m := s.get()
		if got := meta.FindStatusCondition(m.Status.Conditions, typ); got != nil {
			c = *got
			if c.Status == want {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", c)
	})
	return c
}

// An MCPServer for the fixture server over stdio becomes a Running pod on a
// real kubelet: the init container copies the static v0m3 binary into an
// image that holds nothing else, the bridge runs the fixture as its child,
// and every process of the pod runs as the restricted security context
// says (checked on the node, not only in the spec). The operator registers
// it, nothing starts before review, discovery through the bridge reaches
// the fixture, and Discovered becomes True.
func TestStdioServerRunsSandboxedAndIsDiscovered(t *testing.T) {
	t.Parallel()
	needNode(t)
	ns := namespace(t)
	s := stdioServer(t, ns, "search", "first-token")

	conn := s.connection()
	if conn.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_PENDING {
		t.Fatalf("new connection review state %v; want pending", conn.GetReviewState())
	}
	if got, want := conn.GetTransport().GetStreamableHttp().GetUrl(), fmt.Sprintf("http://search.%s.svc.cluster.local:8080/mcp", ns); got != want {
		t.Errorf("registered endpoint %q; want %q", got, want)
	}
	if got, want := conn.GetImageDigest(), fixtureImage[strings.LastIndex(fixtureImage, "@")+1:]; got != want {
		t.Errorf("registered image digest %q; want %q", got, want)
	}
	var pods corev1.PodList
	if err := k8s.List(s.ctx, &pods, client.InNamespace(ns)); err != nil || len(pods.Items) > 0 {
		t.Fatalf("pods before review: %d (err %v); want none", len(pods.Items), err)
	}

	if _, err := services.ApproveConnection(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	pod := s.runningPod(conn.GetConfigRevision())
	assertRestrictedSpec(t, pod)
	assertRestrictedOnNode(t, pod, "bridge")
	s.resolves(pod)

	snap, err := services.Adapter.Discover(as(scenario.Integrator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatalf("Discover through the bridge in pod %s (%s): %v", pod.Name, pod.Status.PodIP, err)
	}
	if !hasTool(snap, "search") {
		t.Errorf("snapshot of the fixture lists tools %v; want search", toolNames(snap))
	}
	if snap.GetConfigRevision() != conn.GetConfigRevision() {
		t.Errorf("snapshot at config revision %d; want %d", snap.GetConfigRevision(), conn.GetConfigRevision())
	}
	c := s.condition(v1alpha1.ConditionDiscovered, metav1.ConditionTrue)
	if c.Reason != v1alpha1.ReasonSnapshotRecorded || !strings.Contains(c.Message, snap.GetId()) {
		t.Errorf("Discovered = %+v; want %s naming snapshot %s", c, v1alpha1.ReasonSnapshotRecorded, snap.GetId())
	}
	if got := s.get().Status.LatestSnapshotDigest; got != snap.GetDigest() {
		t.Errorf("status snapshot digest %q; want %q", got, snap.GetDigest())
	}
	s.condition(v1alpha1.ConditionReady, metav1.ConditionTrue)
}

// An MCPServer whose image serves streamable HTTP itself runs the image's
// own command (no bridge, no init container) under the same restrictions,
// and discovery reaches it directly.
func TestHTTPServerRunsSandboxedAndIsDiscovered(t *testing.T) {
	t.Parallel()
	needNode(t)
	ns := namespace(t)
	s := httpServer(t, ns, "notes")
	conn := s.connection()
	if _, err := services.ApproveConnection(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	pod := s.runningPod(conn.GetConfigRevision())
	if len(pod.Spec.InitContainers) != 0 {
		t.Errorf("HTTP server pod has init containers %v; want none (no bridge)", pod.Spec.InitContainers)
	}
	assertRestrictedSpec(t, pod)
	assertRestrictedOnNode(t, pod, "fixture-server")
	s.resolves(pod)

	snap, err := services.Adapter.Discover(as(scenario.Integrator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatalf("Discover pod %s (%s): %v", pod.Name, pod.Status.PodIP, err)
	}
	if !hasTool(snap, "search") {
		t.Errorf("snapshot lists tools %v; want search", toolNames(snap))
	}
	s.condition(v1alpha1.ConditionDiscovered, metav1.ConditionTrue)
}

func hasTool(s *registryv1.DiscoverySnapshot, name string) bool {
	return slices.Contains(toolNames(s), name)
}

func toolNames(s *registryv1.DiscoverySnapshot) []string {
	var out []string
	for _, t := range s.GetTools() {
		out = append(out, t.GetName())
	}
	return out
}

// assertRestrictedSpec checks the pod as stored: what the restricted Pod
// Security Standard asks (the namespace enforces it too).
func assertRestrictedSpec(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		sc := c.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65532 ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
			sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("container %s security context %+v; want restricted", c.Name, sc)
		}
	}
	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		t.Errorf("pod mounts a service account token")
	}
	for _, st := range pod.Status.InitContainerStatuses {
		if x := st.State.Terminated; x == nil || x.ExitCode != 0 {
			t.Errorf("init container %s state %+v; want exited 0", st.Name, st.State)
		}
	}
}

// assertRestrictedOnNode checks, in /proc on the node, every process of the
// pod whose command line contains marker: unprivileged user and group, no
// capabilities, no_new_privs, a seccomp filter, a read-only root.
func assertRestrictedOnNode(t *testing.T, pod *corev1.Pod, marker string) {
	t.Helper()
	pids := podProcesses(t, pod, marker)
	if len(pids) == 0 {
		t.Fatalf("no process of pod %s (uid %s) runs %q on the node", pod.Name, pod.UID, marker)
	}
	for _, pid := range pids {
		status := procFields(t, pid, "status")
		want := map[string]string{
			"Uid":        "65532\t65532\t65532\t65532",
			"Gid":        "65532\t65532\t65532\t65532",
			"CapEff":     "0000000000000000",
			"CapPrm":     "0000000000000000",
			"CapBnd":     "0000000000000000",
			"NoNewPrivs": "1",
			"Seccomp":    "2",
		}
		for k, v := range want {
			if status[k] != v {
				t.Errorf("process %s of pod %s: %s = %q; want %q", pid, pod.Name, k, status[k], v)
			}
		}
		if !rootReadOnly(t, pid) {
			t.Errorf("process %s of pod %s: root filesystem is writable", pid, pod.Name)
		}
	}
}

// podProcesses lists the pids on this host in pod's cgroup whose command
// line contains marker.
func podProcesses(t *testing.T, pod *corev1.Pod, marker string) []string {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range dirs {
		cg, err := os.ReadFile(filepath.Join(d, "cgroup"))
		if err != nil || !strings.Contains(string(cg), "pod"+string(pod.UID)) {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err == nil && strings.Contains(string(cmd), marker) {
			out = append(out, filepath.Base(d))
		}
	}
	return out
}

func procFields(t *testing.T, pid, file string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", pid, file))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// rootReadOnly reports whether pid's root mount is read-only.
func rootReadOnly(t *testing.T, pid string) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", pid, "mountinfo"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 5 && f[4] == "/" {
			return slices.Contains(strings.Split(f[5], ","), "ro")
		}
	}
	return false
}
