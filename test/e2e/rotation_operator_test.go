package e2e_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	"github.com/v0m3/v0m3/operator/controller"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/policy"
	"github.com/v0m3/v0m3/suite"
)

// TestOperatorRotationServesThroughout rotates an MCPServer's Secret under
// the real operator (a manager against a real kube-apiserver) while a task
// makes governed reads without pause through the real services, to a real
// MCP server that checks its credential against its upstream. envtest has
// no kubelet: the test plays it, starting a "pod" (a fixture process
// holding the Secret's value, as a mounted Secret) for each new pod
// template and reporting the Deployment's status as its controller would;
// a stand-in Service sends new sessions to the newest ready pod.
//
// A rotation to a credential the upstream accepts: the registry keeps
// serving the old revision until the new pod is available, then switches;
// the mapping stays active, and reads go on after the old pod is gone and
// its credential revoked. A rotation to a credential the upstream refuses:
// the pod never becomes ready, the rotation fails, the previous revision
// keeps serving (registry, MCPServer status, a Warning event and the
// task's trace say so). No read fails across both.
func TestOperatorRotationServesThroughout(t *testing.T) {
	t.Parallel()
	// Reads run without pause for as long as the rollouts take, so
	// their number depends on the machine: budgets must not end them.
	unlimited := policy.Limits{Calls: 1 << 40, ResponseBytes: 1 << 50, CostMicros: 1 << 50}
	su, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), TaskBudget: unlimited, RequesterBudget: unlimited})
	if err != nil {
		t.Fatalf("start suite: %v", err)
	}
	t.Cleanup(su.Close)
	w := &world{t: t, s: su}
	dir := testkit.WritableDir(t)
	upstream := filepath.Join(dir, "upstream-accepts")
	setUpstream := func(creds ...string) {
		t.Helper()
		if err := os.WriteFile(upstream, []byte(strings.Join(creds, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	setUpstream("token-1")
	svc := newStandInService(t)
	k8s := startServerOperator(t, w, controller.Options{
		BridgeImage: "ghcr.io/v0m3/v0m3@sha256:" + strings.Repeat("b", 64),
		Endpoint:    func(*v1alpha1.MCPServer) string { return svc.url },
	})
	ctx := context.Background()
	const ns, name = "default", "sources"
	key := client.ObjectKey{Namespace: ns, Name: name}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sources-token"}, StringData: map[string]string{"token": "token-1"}}
	if err := k8s.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, &v1alpha1.MCPServer{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.MCPServerSpec{
			Image:     "ghcr.io/v0m3/fixture@sha256:" + strings.Repeat("a", 64),
			Transport: v1alpha1.TransportSpec{Type: v1alpha1.TransportStreamableHTTP, Port: 8080},
			Credentials: &v1alpha1.CredentialsSpec{
				SecretRef: v1alpha1.SecretKeyRef{Name: "sources-token", Key: "token"},
				Scope:     "read-only access to the synthetic library",
			},
			Owner: "platform-team",
		},
	}); err != nil {
		t.Fatal(err)
	}
	server := func() *v1alpha1.MCPServer {
		t.Helper()
		var s v1alpha1.MCPServer
		if err := k8s.Get(ctx, key, &s); err != nil {
			t.Fatal(err)
		}
		return &s
	}
	connection := func() *registryv1.Connection {
		t.Helper()
		c, err := w.s.Registry.GetConnection(testkit.As(w.s, scenario.Integrator), &registryv1.GetConnectionRequest{Id: server().Status.ConnectionID})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	testkit.Eventually(t, "the operator registers the server", func() bool { return server().Status.ConnectionID != "" })
	if _, err := w.s.Registry.ReviewConnection(testkit.As(w.s, scenario.Reviewer), &registryv1.ReviewConnectionRequest{
		ConnectionId: connection().GetId(), ConfigRevision: 1, Approve: true}); err != nil {
		t.Fatalf("review connection: %v", err)
	}

	kl := &kubelet{t: t, k8s: k8s, key: key, secret: "sources-token", svc: svc, dir: dir,
		start: func(cred, callLog string) (string, func(), error) {
			return startPod(t, "fixture-server", "--upstream-credentials", upstream, "--credential-file", cred, "--call-log", callLog)
		}}
	first := kl.rollOut(1)
	testkit.Eventually(t, "revision 1 serving", func() bool { return server().Status.ServingConfigRevision == 1 })
	w.conn = connection()
	w.snap = w.discover()
	w.mapping = w.review(w.propose("", w.snap, "search", "query"))
	task := w.startTask()

	// Reads run without pause from here to the end.
	stop := make(chan struct{})
	var succeeded atomic.Int64
	type result struct{ ok, failed int }
	done := make(chan result)
	go func() {
		var r result
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- r
				return
			default:
			}
			got, err := w.retrieve(task, fmt.Sprintf("call-%d", i))
			if err != nil || got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
				r.failed++
				t.Errorf("read %d: %v %v (%s)", i, got.GetState(), err, got.GetRefusalDetail())
				continue
			}
			r.ok++
			succeeded.Add(1)
		}
	}()
	stopped := false
	finish := func() result {
		if !stopped {
			stopped = true
			close(stop)
		}
		return <-done
	}
	defer func() {
		if !stopped {
			finish()
		}
	}()
	// readAfter waits for a read that started after now to succeed.
	readAfter := func(what string) {
		t.Helper()
		n := succeeded.Load()
		testkit.Eventually(t, "a read after "+what, func() bool { return succeeded.Load() >= n+2 })
	}
	readAfter("the first rollout")

	// A rotation the upstream accepts (it issued the new credential while
	// the old one still works, as a rotation overlaps).
	setUpstream("token-1", "token-2")
	secret.StringData = map[string]string{"token": "token-2"}
	if err := k8s.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "config revision 2 registered", func() bool { return connection().GetConfigRevision() == 2 })
	if c := connection(); c.GetServingConfigRevision() != 1 {
		t.Fatalf("before the new pod is available the registry serves revision %d, want 1", c.GetServingConfigRevision())
	}
	readAfter("revision 2 was registered, before its pod runs")
	second := kl.rollOut(2)
	testkit.Eventually(t, "revision 2 serving", func() bool {
		return connection().GetServingConfigRevision() == 2 && server().Status.ServingConfigRevision == 2
	})
	readAfter("revision 2 serves")
	// The old pod goes after its drain delay; then its credential is revoked.
	first.stop()
	setUpstream("token-2")
	readAfter("the old pod is gone and its credential revoked")
	if second.calls() == 0 {
		t.Errorf("no read reached the pod of revision 2")
	}
	if st := w.mappingNow().GetState(); st != registryv1.MappingState_MAPPING_STATE_ACTIVE {
		t.Errorf("mapping after a rotation within scope is %v, want ACTIVE", st)
	}

	// A rotation to a credential the upstream refuses.
	secret.StringData = map[string]string{"token": "token-refused"}
	if err := k8s.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "config revision 3 registered", func() bool { return connection().GetConfigRevision() == 3 })
	if third := kl.rollOut(3); third != nil {
		t.Fatalf("a pod holding a refused credential became ready")
	}
	testkit.Eventually(t, "the rotation to revision 3 fails", func() bool {
		c := meta.FindStatusCondition(server().Status.Conditions, v1alpha1.ConditionServing)
		return c != nil && c.Reason == v1alpha1.ReasonRotationFailed
	})
	readAfter("the failed rotation")
	s, c := server(), connection()
	if s.Status.ServingConfigRevision != 2 || c.GetServingConfigRevision() != 2 || c.GetRolloutFailure().GetConfigRevision() != 3 ||
		!strings.Contains(c.GetRolloutFailure().GetDetail(), "ProgressDeadlineExceeded") {
		t.Errorf("after the failed rotation: status serving %d, registry serving %d, failure %v; want 2 serving and revision 3's failure recorded",
			s.Status.ServingConfigRevision, c.GetServingConfigRevision(), c.GetRolloutFailure())
	}
	if s.Status.Rotation == nil || s.Status.Rotation.ToRevision != 3 || s.Status.Rotation.Failure == "" {
		t.Errorf("rotation status %+v; want 2 -> 3 failed with a reason", s.Status.Rotation)
	}
	testkit.Eventually(t, "a RotationFailed event", func() bool {
		var list eventsv1.EventList
		if err := k8s.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false
		}
		for _, e := range list.Items {
			if e.Reason == v1alpha1.ReasonRotationFailed && e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, "revision 2 keeps serving") {
				return true
			}
		}
		return false
	})
	if st := w.mappingNow().GetState(); st != registryv1.MappingState_MAPPING_STATE_ACTIVE {
		t.Errorf("mapping after a failed rotation is %v, want ACTIVE", st)
	}

	r := finish()
	// The task's trace says which revision its reads used and why not the
	// newest.
	tr, err := w.s.Evidence.GetTrace(testkit.As(w.s, scenario.Auditor), &evidencev1.GetTraceRequest{TaskId: task.GetTask().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	var noted bool
	for _, e := range tr.GetEvents() {
		if p := e.GetProduct(); p.GetKind() == evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_EXECUTED &&
			strings.Contains(p.GetDetail(), "config r2") && strings.Contains(p.GetDetail(), "config revision 3 did not roll out (ProgressDeadlineExceeded") {
			noted = true
		}
		if strings.Contains(e.String(), "token-") {
			t.Errorf("trace event carries a credential: %v", e)
		}
	}
	if !noted {
		t.Errorf("no executed read in the trace says revision 2 served because revision 3 did not roll out")
	}
	if r.failed != 0 || r.ok == 0 {
		t.Errorf("%d reads succeeded and %d failed across two rotations; want none failed", r.ok, r.failed)
	}
}

// startServerOperator runs the MCPServer reconciler under a real manager
// against a fresh kube-apiserver, registering into w's registry as the
// operator peer, and returns a client of that apiserver.
func startServerOperator(t *testing.T, w *world, opts controller.Options) client.Client {
	t.Helper()
	cfg, scheme := startKube(t)
	peers, err := w.s.PeerClients(identity.Operator)
	if err != nil {
		t.Fatal(err)
	}
	skip := true
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:     scheme,
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: &skip},
	})
	if err != nil {
		t.Fatalf("manager: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &controller.Reconciler{Client: mgr.GetClient(), Scheme: scheme, Registry: peers.Registry, Events: mgr.GetEventRecorder("v0m3-operator"), Options: opts}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return k8s
}

// standInService stands in for an MCPServer's Kubernetes Service: a new
// MCP session goes to the newest ready pod; the requests of an open
// session stay with the pod that opened it, as they would on its
// keep-alive connection; a pod that is gone answers nothing.
type standInService struct {
	url string

	mu       sync.Mutex
	current  *url.URL
	sessions map[string]*url.URL
}

func newStandInService(t *testing.T) *standInService {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &standInService{url: "http://" + lis.Addr().String() + "/mcp", sessions: map[string]*url.URL{}}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

// route sends new sessions to the pod at base from now on.
func (s *standInService) route(base *url.URL) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current = base
}

func (s *standInService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	target := s.current
	if u, ok := s.sessions[r.Header.Get("Mcp-Session-Id")]; ok {
		target = u
	}
	s.mu.Unlock()
	if target == nil {
		http.Error(w, "no ready endpoint", http.StatusServiceUnavailable)
		return
	}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			if id := resp.Header.Get("Mcp-Session-Id"); id != "" {
				s.mu.Lock()
				if _, ok := s.sessions[id]; !ok {
					s.sessions[id] = target
				}
				s.mu.Unlock()
			}
			return nil
		},
	}
	rp.ServeHTTP(w, r)
}

// kubelet plays the node and the Deployment controller envtest lacks for
// one MCPServer.
type kubelet struct {
	t      *testing.T
	k8s    client.Client
	key    client.ObjectKey
	secret string // the Secret the server's pods mount
	svc    *standInService
	dir    string
	// start runs one pod's server with its credential file and call log.
	start func(cred, callLog string) (string, func(), error)
}

// pod is one running server process.
type pod struct {
	stop    func()
	callLog string
}

// calls counts the tool calls the pod answered.
func (p *pod) calls() int {
	b, err := os.ReadFile(p.callLog)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), `"tools/call"`)
}

// rollOut waits for the Deployment's pod template at config revision rev,
// starts its pod with the Secret's current value and, when the pod is
// ready, routes new sessions to it and reports the rollout complete. A pod
// that does not start (its server refused its credential) is reported as
// the Deployment controller would once its progress deadline passed, and
// rollOut returns nil.
func (k *kubelet) rollOut(rev int64) *pod {
	t := k.t
	t.Helper()
	ctx := context.Background()
	var d appsv1.Deployment
	testkit.Eventually(t, fmt.Sprintf("the pod template at config revision %d", rev), func() bool {
		return k.k8s.Get(ctx, k.key, &d) == nil && d.Spec.Template.Annotations[controller.AnnotationConfigRevision] == fmt.Sprint(rev)
	})
	var sec corev1.Secret
	if err := k.k8s.Get(ctx, client.ObjectKey{Namespace: k.key.Namespace, Name: k.secret}, &sec); err != nil {
		t.Fatal(err)
	}
	cred := filepath.Join(k.dir, fmt.Sprintf("%s-pod-%d-credential", k.key.Name, rev))
	if err := os.WriteFile(cred, sec.Data["token"], 0o600); err != nil {
		t.Fatal(err)
	}
	p := &pod{callLog: filepath.Join(k.dir, fmt.Sprintf("%s-pod-%d-calls.jsonl", k.key.Name, rev))}
	addr, stop, err := k.start(cred, p.callLog)
	p.stop = stop
	if err != nil {
		if !strings.Contains(err.Error(), "refused") {
			t.Fatalf("pod of revision %d: %v", rev, err)
		}
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 2, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1,
			UnavailableReplicas: 1, Conditions: []appsv1.DeploymentCondition{{
				Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded",
				Message: fmt.Sprintf("ReplicaSet %q has timed out progressing.", k.key.Name)}}}
		k.setStatus(&d)
		return nil
	}
	u, err := url.Parse(addr)
	if err != nil {
		t.Fatal(err)
	}
	k.svc.route(&url.URL{Scheme: u.Scheme, Host: u.Host})
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
	k.setStatus(&d)
	return p
}

// setStatus writes d's status, again on a fresher read when the operator
// wrote the Deployment in between (its pod template unchanged).
func (k *kubelet) setStatus(d *appsv1.Deployment) {
	k.t.Helper()
	want := d.Status
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		err := k.k8s.Status().Update(context.Background(), d)
		if apierrors.IsConflict(err) {
			if gerr := k.k8s.Get(context.Background(), k.key, d); gerr != nil {
				return gerr
			}
			d.Status = want
			d.Status.ObservedGeneration = d.Generation
		}
		return err
	})
	if err != nil {
		k.t.Fatalf("update Deployment status: %v", err)
	}
}

// startPod runs a fixture (the v0m3 subcommand fixture) over HTTP with args
// until the test ends or stop. It returns the server's URL once it listens,
// or an error with what it said when it exited first.
func startPod(t *testing.T, fixture string, args ...string) (string, func(), error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, v0m3Bin, append([]string{fixture, "--transport", "http", "--addr", "127.0.0.1:0"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); _ = cmd.Wait() }) }
	t.Cleanup(stop)
	type outcome struct {
		url string
		err error
	}
	out := make(chan outcome, 1)
	go func() {
		re := regexp.MustCompile(`listening on (http://\S+)`)
		var said []string
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				out <- outcome{url: m[1]}
				for sc.Scan() {
				}
				return
			}
			said = append(said, sc.Text())
		}
		out <- outcome{err: errors.New(strings.Join(said, "; "))}
	}()
	select {
	case o := <-out:
		if o.err != nil {
			stop()
		}
		return o.url, stop, o.err
	case <-time.After(60 * time.Second):
		stop()
		return "", stop, errors.New("the pod neither listened nor exited within 60 s")
	}
}

// TestOperatorRotationInvalidatesApprovals rotates the Secret of an
// MCPServer running the renderer, under the real operator, while approvals
// wait. Approved while the previous revision still serves (its new pod not
// yet available), a request executes on the old pod; once the new pod is
// available and the registry serves the new revision, an approval bound to
// the previous one is refused naming the credentials binding and renders
// nothing; the mapping stays active and a new request executes on the new
// pod.
func TestOperatorRotationInvalidatesApprovals(t *testing.T) {
	t.Parallel()
	s := startSuite(t, t.TempDir())
	w := &world{t: t, s: s}
	c := stackOf(s)
	dir := testkit.WritableDir(t)
	env := &rendererEnv{workDir: filepath.Join(dir, "work"), callLog: filepath.Join(dir, "calls.jsonl")}
	svc := newStandInService(t)
	k8s := startServerOperator(t, w, controller.Options{
		BridgeImage: "ghcr.io/v0m3/v0m3@sha256:" + strings.Repeat("b", 64),
		Endpoint:    func(*v1alpha1.MCPServer) string { return svc.url },
	})
	ctx := context.Background()
	const ns, name = "default", "renderer"
	key := client.ObjectKey{Namespace: ns, Name: name}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "renderer-token"}, StringData: map[string]string{"token": "token-1"}}
	if err := k8s.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, &v1alpha1.MCPServer{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.MCPServerSpec{
			Image:     "ghcr.io/v0m3/renderer@sha256:" + strings.Repeat("c", 64),
			Transport: v1alpha1.TransportSpec{Type: v1alpha1.TransportStreamableHTTP, Port: 8080},
			Credentials: &v1alpha1.CredentialsSpec{
				SecretRef: v1alpha1.SecretKeyRef{Name: "renderer-token", Key: "token"},
				Scope:     "renders previews of the caller's documents",
			},
			Owner: "platform-team",
		},
	}); err != nil {
		t.Fatal(err)
	}
	status := func() v1alpha1.MCPServerStatus {
		t.Helper()
		var m v1alpha1.MCPServer
		if err := k8s.Get(ctx, key, &m); err != nil {
			t.Fatal(err)
		}
		return m.Status
	}
	connection := func() *registryv1.Connection {
		t.Helper()
		conn, err := s.Registry.GetConnection(testkit.As(c, scenario.Integrator), &registryv1.GetConnectionRequest{Id: status().ConnectionID})
		if err != nil {
			t.Fatal(err)
		}
		return conn
	}
	testkit.Eventually(t, "the operator registers the renderer", func() bool { return status().ConnectionID != "" })
	if _, err := s.Registry.ReviewConnection(testkit.As(c, scenario.Reviewer), &registryv1.ReviewConnectionRequest{
		ConnectionId: connection().GetId(), ConfigRevision: 1, Approve: true}); err != nil {
		t.Fatalf("review connection: %v", err)
	}
	kl := &kubelet{t: t, k8s: k8s, key: key, secret: "renderer-token", svc: svc, dir: dir,
		start: func(_, callLog string) (string, func(), error) {
			// Every pod renders into the one work directory and call log,
			// as the renderer's replicas share them.
			return startPod(t, "fixture-renderer", "--work-dir", env.workDir, "--call-log", env.callLog)
		}}
	kl.rollOut(1)
	testkit.Eventually(t, "revision 1 serving", func() bool { return status().ServingConfigRevision == 1 })
	env.conn = connection()
	mapRenderer(t, c, env)
	task := startPreviewTask(t, c).GetTask().GetId()

	duringRollout := submitPreview(t, c, task, "call-during-rollout")
	bound := submitPreview(t, c, task, "call-bound-to-1")
	secret.StringData = map[string]string{"token": "token-2"}
	if err := k8s.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "config revision 2 registered", func() bool { return connection().GetConfigRevision() == 2 })
	if got := connection().GetServingConfigRevision(); got != 1 {
		t.Fatalf("before the new pod is available the registry serves revision %d, want 1", got)
	}
	done, err := approve(c, duringRollout.GetId(), documentDigest)
	if err != nil || done.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("approval while revision 1 still serves: %v, %v; want EXECUTED on the old pod", done.GetState(), err)
	}
	rendered := env.renders(t)
	if rendered != 1 {
		t.Fatalf("renders = %d, want 1", rendered)
	}

	kl.rollOut(2)
	testkit.Eventually(t, "revision 2 serving", func() bool {
		return connection().GetServingConfigRevision() == 2 && status().ServingConfigRevision == 2
	})
	_, err = approve(c, bound.GetId(), documentDigest)
	if !apierror.Is(err, codes.FailedPrecondition, "APPROVAL_INVALIDATED") || apierror.Info(err).GetMetadata()["binding"] != "credentials" {
		t.Fatalf("approving a request bound to revision 1 once revision 2 serves: %v; want APPROVAL_INVALIDATED naming credentials", err)
	}
	if n := env.renders(t); n != rendered {
		t.Fatalf("an invalidated approval rendered: renders = %d, want %d", n, rendered)
	}
	m, err := s.Registry.GetMapping(testkit.As(c, scenario.Integrator), &registryv1.GetMappingRequest{Id: env.mapping.GetId()})
	if err != nil || m.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE {
		t.Fatalf("mapping after the rotation: %v, %v; want ACTIVE", m.GetState(), err)
	}
	done, err = approve(c, submitPreview(t, c, task, "call-after").GetId(), documentDigest)
	if err != nil || done.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("a preview approved after the rotation: %v, %v; want EXECUTED", done.GetState(), err)
	}
}
