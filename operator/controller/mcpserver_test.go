package controller_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	"github.com/v0m3/v0m3/operator/controller"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

const testImage = "ghcr.io/v0m3/fixture@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// fixture is one test's namespace, reconciler and MCPServer.
type fixture struct {
	t      *testing.T
	ctx    context.Context
	ns     string
	r      *controller.Reconciler
	events *recorder
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ev := &recorder{}
	return &fixture{
		t:      t,
		ctx:    context.Background(),
		ns:     namespace(t),
		events: ev,
		r: &controller.Reconciler{
			Client:   k8s,
			Scheme:   scheme,
			Registry: registry,
			Events:   ev,
			Options:  controller.Options{BridgeImage: "ghcr.io/v0m3/v0m3@sha256:" + strings.Repeat("b", 64)},
		},
	}
}

// stdioServer is a valid stdio MCPServer using the Secret "search-token".
func (f *fixture) stdioServer(name string) *v1alpha1.MCPServer {
	limit := resource.MustParse("32Mi")
	return &v1alpha1.MCPServer{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns},
		Spec: v1alpha1.MCPServerSpec{
			Image:     testImage,
			Transport: v1alpha1.TransportSpec{Type: v1alpha1.TransportStdio},
			Command:   []string{"/fixture-server"},
			Args:      []string{"--transport", "stdio"},
			Env:       []v1alpha1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}},
			Credentials: &v1alpha1.CredentialsSpec{
				SecretRef: v1alpha1.SecretKeyRef{Name: "search-token", Key: "token"},
				Scope:     "read-only access to the docs search index",
				EnvName:   "SEARCH_TOKEN",
			},
			Sandbox: v1alpha1.SandboxSpec{
				WorkDirSizeLimit: &limit,
				Egress:           []v1alpha1.EgressRule{{CIDR: "203.0.113.0/24", Ports: []int32{443}}},
			},
			Owner: "team-sources",
		},
	}
}

func (f *fixture) secret(name, token string) *corev1.Secret {
	f.t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns}, StringData: map[string]string{"token": token}}
	if err := k8s.Create(f.ctx, s); err != nil {
		f.t.Fatalf("create Secret: %v", err)
	}
	return s
}

func (f *fixture) create(s *v1alpha1.MCPServer) {
	f.t.Helper()
	if err := k8s.Create(f.ctx, s); err != nil {
		f.t.Fatalf("create MCPServer: %v", err)
	}
}

func (f *fixture) reconcile(name string) reconcile.Result {
	f.t.Helper()
	res, err := f.r.Reconcile(f.ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: f.ns, Name: name}})
	if err != nil {
		f.t.Fatalf("reconcile: %v", err)
	}
	return res
}

func (f *fixture) get(name string, obj client.Object) {
	f.t.Helper()
	if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: name}, obj); err != nil {
		f.t.Fatalf("get %T %s: %v", obj, name, err)
	}
}

func (f *fixture) server(name string) *v1alpha1.MCPServer {
	f.t.Helper()
	var s v1alpha1.MCPServer
	f.get(name, &s)
	return &s
}

func (f *fixture) condition(s *v1alpha1.MCPServer, typ string) metav1.Condition {
	f.t.Helper()
	c := meta.FindStatusCondition(s.Status.Conditions, typ)
	if c == nil {
		f.t.Fatalf("condition %s missing; conditions: %+v", typ, s.Status.Conditions)
	}
	return *c
}

// approve has a reviewer approve name's registry connection at its current
// config revision, as a person would after the operator registered it.
func (f *fixture) approve(name string) {
	f.t.Helper()
	id := f.server(name).Status.ConnectionID
	conn, err := registry.GetConnection(f.ctx, &registryv1.GetConnectionRequest{Id: id})
	if err != nil {
		f.t.Fatalf("GetConnection: %v", err)
	}
	if _, err := services.ApproveConnection(f.ctx, conn); err != nil {
		f.t.Fatal(err)
	}
}

// wantServing fails unless both the registry and s's status say revision
// serves.
func (f *fixture) wantServing(s *v1alpha1.MCPServer, revision int64) {
	f.t.Helper()
	conn, err := registry.GetConnection(f.ctx, &registryv1.GetConnectionRequest{Id: s.Status.ConnectionID})
	if err != nil {
		f.t.Fatalf("GetConnection: %v", err)
	}
	if conn.GetServingConfigRevision() != revision || s.Status.ServingConfigRevision != revision {
		f.t.Errorf("serving config revision: registry %d, status %d; want %d (latest %d)",
			conn.GetServingConfigRevision(), s.Status.ServingConfigRevision, revision, conn.GetConfigRevision())
	}
}

func (f *fixture) revisions(connID string) []*registryv1.ConfigRevision {
	f.t.Helper()
	out, err := registry.ListConfigRevisions(f.ctx, &registryv1.ListConfigRevisionsRequest{ConnectionId: connID})
	if err != nil {
		f.t.Fatalf("ListConfigRevisions: %v", err)
	}
	return out.GetRevisions()
}

// A manifest that breaks the schema's rules is refused by the API server
// itself, with a message that says what to fix.
func TestInvalidManifestRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tests := []struct {
		name   string
		mutate func(*v1alpha1.MCPServer)
		want   string
	}{
		{"image by tag", func(s *v1alpha1.MCPServer) { s.Spec.Image = "ghcr.io/v0m3/fixture:latest" }, "image must be pinned by digest"},
		{"stdio without command", func(s *v1alpha1.MCPServer) { s.Spec.Command = nil }, "a stdio server needs spec.command"},
		{"http without port", func(s *v1alpha1.MCPServer) { s.Spec.Transport.Type = v1alpha1.TransportStreamableHTTP }, "needs spec.transport.port"},
		{"unknown transport", func(s *v1alpha1.MCPServer) { s.Spec.Transport.Type = "sse" }, `supported values: "stdio", "streamableHTTP"`},
		{"egress not a CIDR", func(s *v1alpha1.MCPServer) { s.Spec.Sandbox.Egress[0].CIDR = "example.com" }, "egress cidr must be a CIDR"},
		{"no owner", func(s *v1alpha1.MCPServer) { s.Spec.Owner = "" }, "spec.owner"},
		{"credential without scope", func(s *v1alpha1.MCPServer) { s.Spec.Credentials.Scope = "" }, "spec.credentials.scope"},
		{"privileged port", func(s *v1alpha1.MCPServer) { s.Spec.Transport.Port = 80 }, "spec.transport.port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := f.stdioServer("bad")
			tt.mutate(s)
			err := k8s.Create(f.ctx, s)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("create = %v; want Invalid", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
		})
	}
}

// Reconciling a new MCPServer creates its four owned objects under the
// restricted Pod Security Standard and a registry connection whose config
// revision names the image digest and the Secret's version.
func TestReconcileCreatesWorkloadAndConnection(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sec := f.secret("search-token", "s3cr3t-value-1")
	f.create(f.stdioServer("search"))
	// Registered, but nothing runs before a reviewer approves it.
	if res := f.reconcile("search"); res.RequeueAfter <= 0 {
		t.Errorf("reconcile of a server pending review = %+v; want a requeue to notice the review", res)
	}
	s := f.server("search")
	if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "search"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Deployment get = %v; want none before the connection is reviewed", err)
	}
	if c := f.condition(s, v1alpha1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonConnectionPending ||
		!strings.Contains(c.Message, s.Status.ConnectionID) {
		t.Errorf("Ready = %+v; want False/ConnectionPendingReview naming the connection", c)
	}
	if c := f.condition(s, v1alpha1.ConditionReviewRequired); c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonConnectionPending {
		t.Errorf("ReviewRequired = %s/%s; want True/ConnectionPendingReview", c.Status, c.Reason)
	}
	if !f.events.has(v1alpha1.ReasonConnectionPending) {
		t.Errorf("events = %v; want ConnectionPendingReview", f.events.events)
	}
	f.approve("search")
	f.reconcile("search")

	s = f.server("search")
	if !strings.Contains(strings.Join(s.Finalizers, ","), controller.Finalizer) {
		t.Errorf("finalizers = %v; want %s", s.Finalizers, controller.Finalizer)
	}

	var sa corev1.ServiceAccount
	f.get("search", &sa)
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("ServiceAccount automountServiceAccountToken = %v; want false", sa.AutomountServiceAccountToken)
	}

	var d appsv1.Deployment
	f.get("search", &d)
	pod := d.Spec.Template.Spec
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken || pod.ServiceAccountName != "search" {
		t.Errorf("pod service account = %q automount %v; want search, false", pod.ServiceAccountName, pod.AutomountServiceAccountToken)
	}
	if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context = %+v; want runAsNonRoot and RuntimeDefault seccomp", psc)
	}
	if len(pod.InitContainers) != 1 || pod.InitContainers[0].Image != f.r.Options.BridgeImage {
		t.Fatalf("init containers = %+v; want the bridge installer", pod.InitContainers)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("containers = %d; want 1", len(pod.Containers))
	}
	server := pod.Containers[0]
	if server.Image != testImage || server.Command[0] != "/opt/v0m3/bin/v0m3" ||
		!strings.Contains(strings.Join(server.Args, " "), "bridge --allowed-hosts search,search."+f.ns+",search."+f.ns+".svc,search."+f.ns+".svc.cluster.local --listen :8080 --path /mcp -- /fixture-server --transport stdio") {
		t.Errorf("server container runs %v %v; want the bridge running /fixture-server, answering only its Service's names", server.Command, server.Args)
	}
	// A rotation's new pod must be available before the old one goes, and
	// the old one keeps its open connections while the registry switches.
	if ru := d.Spec.Strategy.RollingUpdate; ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("rolling update %+v; want maxUnavailable 0", ru)
	}
	if l := server.Lifecycle; l == nil || l.PreStop == nil || l.PreStop.Sleep == nil || l.PreStop.Sleep.Seconds <= 0 {
		t.Errorf("server lifecycle %+v; want a preStop sleep to drain", l)
	}
	for _, c := range append(pod.InitContainers, pod.Containers...) {
		sc := c.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0 ||
			sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault ||
			(sc.Privileged != nil && *sc.Privileged) {
			t.Errorf("container %s security context = %+v; want the restricted profile", c.Name, sc)
		}
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	if w := volumes["work"].EmptyDir; w == nil || w.SizeLimit == nil || w.SizeLimit.String() != "32Mi" {
		t.Errorf("work volume = %+v; want an emptyDir limited to 32Mi", volumes["work"])
	}
	if b := volumes["bridge"].EmptyDir; b == nil || b.SizeLimit == nil {
		t.Errorf("bridge volume = %+v; want a bounded emptyDir", volumes["bridge"])
	}
	if c := volumes["credentials"].Secret; c == nil || c.SecretName != "search-token" {
		t.Errorf("credentials volume = %+v; want Secret search-token", volumes["credentials"])
	}
	for _, e := range server.Env {
		if e.Value == "s3cr3t-value-1" {
			t.Errorf("env %s carries the secret value", e.Name)
		}
	}
	if d.Spec.Template.Annotations[controller.AnnotationConfigHash] != s.Status.ConfigHash || s.Status.ConfigHash == "" {
		t.Errorf("pod template config hash = %q; status says %q", d.Spec.Template.Annotations[controller.AnnotationConfigHash], s.Status.ConfigHash)
	}

	var svc corev1.Service
	f.get("search", &svc)
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 8080 || svc.Spec.Selector[controller.LabelServer] != "search" {
		t.Errorf("Service = %+v; want port 8080 selecting the server's pods", svc.Spec)
	}

	var np networkingv1.NetworkPolicy
	f.get("search", &np)
	if len(np.Spec.PolicyTypes) != 2 {
		t.Errorf("NetworkPolicy types = %v; want Ingress and Egress (default deny)", np.Spec.PolicyTypes)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 ||
		np.Spec.Ingress[0].From[0].PodSelector.MatchLabels["app.kubernetes.io/component"] != "adapter" {
		t.Errorf("NetworkPolicy ingress = %+v; want only the adapter's pods", np.Spec.Ingress)
	}
	if len(np.Spec.Egress) != 1 || np.Spec.Egress[0].To[0].IPBlock.CIDR != "203.0.113.0/24" || np.Spec.Egress[0].Ports[0].Port.IntValue() != 443 {
		t.Errorf("NetworkPolicy egress = %+v; want only 203.0.113.0/24:443", np.Spec.Egress)
	}

	for _, obj := range []client.Object{&sa, &d, &svc, &np} {
		refs := obj.GetOwnerReferences()
		if len(refs) != 1 || refs[0].UID != s.UID || refs[0].Controller == nil || !*refs[0].Controller {
			t.Errorf("%T owner references = %+v; want the MCPServer as controller", obj, refs)
		}
	}

	// The registry connection.
	if s.Status.ConnectionID == "" || s.Status.ConfigRevision != 1 {
		t.Fatalf("status connection %q revision %d; want a connection at revision 1", s.Status.ConnectionID, s.Status.ConfigRevision)
	}
	conn, err := registry.GetConnection(f.ctx, &registryv1.GetConnectionRequest{Id: s.Status.ConnectionID})
	if err != nil {
		t.Fatalf("GetConnection: %v", err)
	}
	wantCred := "search-token@" + sec.ResourceVersion
	if conn.GetConfigRevision() != 1 || conn.GetImageDigest() != "sha256:"+strings.Repeat("0123456789abcdef", 4) ||
		conn.GetCredentialVersion() != wantCred || conn.GetCredentialScope() != "read-only access to the docs search index" ||
		conn.GetCredentialRef() != "" || conn.GetOwner() != "team-sources" || conn.GetDisplayName() != f.ns+"/search" {
		t.Errorf("connection = %v; want revision 1, the image digest, credential %s and no credential_ref", conn, wantCred)
	}
	if u := conn.GetTransport().GetStreamableHttp().GetUrl(); u != "http://search."+f.ns+".svc.cluster.local:8080/mcp" {
		t.Errorf("registered URL = %q; want the Service's MCP endpoint", u)
	}
	if !strings.HasPrefix(conn.GetWorkloadDigest(), "sha256:") {
		t.Errorf("workload digest = %q; want the workload shape's digest", conn.GetWorkloadDigest())
	}
	if s.Status.ConfigDigest != conn.GetConfigDigest() || s.Status.CredentialVersion != wantCred {
		t.Errorf("status = %+v; want the registry's digest and credential version", s.Status)
	}

	// Conditions: pods cannot run in envtest, so Ready waits on the rollout.
	if c := f.condition(s, v1alpha1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonProgressing {
		t.Errorf("Ready = %s/%s; want False/Progressing", c.Status, c.Reason)
	}
	if c := f.condition(s, v1alpha1.ConditionCredentialsReady); c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonCredentialsCurrent {
		t.Errorf("CredentialsReady = %s/%s; want True/CredentialsCurrent", c.Status, c.Reason)
	}
	if c := f.condition(s, v1alpha1.ConditionReviewRequired); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonReviewed {
		t.Errorf("ReviewRequired = %s/%s; want False/Reviewed", c.Status, c.Reason)
	}
	if c := f.condition(s, v1alpha1.ConditionDiscovered); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonAwaitingDiscovery {
		t.Errorf("Discovered = %s/%s; want False/AwaitingDiscovery", c.Status, c.Reason)
	}
	if s.Status.ObservedGeneration != s.Generation {
		t.Errorf("observedGeneration = %d; want %d", s.Status.ObservedGeneration, s.Generation)
	}
	if !f.events.has("Registered") {
		t.Errorf("events = %v; want Registered", f.events.events)
	}
}

// A second reconcile of a settled MCPServer writes nothing: no owned object,
// no status and no registry revision changes.
func TestReconcileIsIdempotent(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.secret("search-token", "v1")
	f.create(f.stdioServer("search"))
	f.reconcile("search")
	f.approve("search")
	f.reconcile("search") // the first passes add the finalizer, status and workload

	versions := func() map[string]string {
		out := map[string]string{}
		for _, obj := range []client.Object{&v1alpha1.MCPServer{}, &corev1.ServiceAccount{}, &appsv1.Deployment{}, &corev1.Service{}, &networkingv1.NetworkPolicy{}} {
			f.get("search", obj)
			out[typeName(obj)] = obj.GetResourceVersion()
		}
		return out
	}
	before := versions()
	f.reconcile("search")
	f.reconcile("search")
	after := versions()
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s resourceVersion %s -> %s; a settled reconcile must not write", k, v, after[k])
		}
	}
	if n := len(f.revisions(f.server("search").Status.ConnectionID)); n != 1 {
		t.Errorf("config revisions = %d; want 1", n)
	}
}

// Rotating the referenced Secret creates a new config revision in the
// registry, rolls the Deployment through its pod-template annotation and
// shows the rotation in progress until the new pods are available.
func TestSecretRotation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sec := f.secret("search-token", "old-token")
	f.create(f.stdioServer("search"))
	f.reconcile("search")
	f.approve("search")
	f.reconcile("search")
	var d appsv1.Deployment
	f.get("search", &d)
	oldHash := d.Spec.Template.Annotations[controller.AnnotationConfigHash]

	sec.StringData = map[string]string{"token": "new-token"}
	if err := k8s.Update(f.ctx, sec); err != nil {
		t.Fatalf("rotate Secret: %v", err)
	}
	f.reconcile("search")

	s := f.server("search")
	revs := f.revisions(s.Status.ConnectionID)
	if len(revs) != 2 {
		t.Fatalf("config revisions = %d; want 2 after rotation", len(revs))
	}
	latest := revs[1]
	wantCred := "search-token@" + sec.ResourceVersion
	if latest.GetRevision() != 2 || latest.GetCredentialVersion() != wantCred || !strings.HasPrefix(latest.GetReason(), "credential rotation") {
		t.Errorf("revision 2 = %v; want credential %s for a credential rotation", latest, wantCred)
	}
	if revs[0].GetCredentialVersion() == wantCred {
		t.Errorf("revision 1 changed its credential version")
	}
	f.get("search", &d)
	if h := d.Spec.Template.Annotations[controller.AnnotationConfigHash]; h == oldHash || h != s.Status.ConfigHash {
		t.Errorf("pod template hash %q (was %q, status %q); want a new hash to roll the pods", h, oldHash, s.Status.ConfigHash)
	}
	if d.Spec.Template.Annotations[controller.AnnotationConfigRevision] != "2" {
		t.Errorf("pod template revision = %q; want 2", d.Spec.Template.Annotations[controller.AnnotationConfigRevision])
	}
	// A credential rotation keeps the review: the pods roll without one.
	if conn, err := registry.GetConnection(f.ctx, &registryv1.GetConnectionRequest{Id: s.Status.ConnectionID}); err != nil ||
		conn.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_APPROVED {
		t.Errorf("connection after rotation: %v, %v; want still APPROVED", conn.GetReviewState(), err)
	}
	if s.Status.ConfigRevision != 2 || s.Status.Rotation == nil || s.Status.Rotation.FromRevision != 1 ||
		s.Status.Rotation.ToRevision != 2 || s.Status.Rotation.CompletionTime != nil {
		t.Fatalf("status revision %d rotation %+v; want 1 -> 2 in progress", s.Status.ConfigRevision, s.Status.Rotation)
	}
	if c := f.condition(s, v1alpha1.ConditionCredentialsReady); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonRotationInProgress {
		t.Errorf("CredentialsReady = %s/%s; want False/RotationInProgress", c.Status, c.Reason)
	}
	if !f.events.has(v1alpha1.ReasonRotationInProgress) {
		t.Errorf("events = %v; want RotationInProgress", f.events.events)
	}
	// Until the new pods are available the registry serves revision 1:
	// calls execute, and approvals stay bound, on the credential in place.
	f.wantServing(s, 1)
	if c := f.condition(s, v1alpha1.ConditionServing); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonRolloutPending {
		t.Errorf("Serving = %s/%s; want False/RolloutPending", c.Status, c.Reason)
	}

	// envtest runs no Deployment controller or kubelet: report the new
	// ReplicaSet available the way the Deployment controller would.
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
	if err := k8s.Status().Update(f.ctx, &d); err != nil {
		t.Fatalf("update Deployment status: %v", err)
	}
	f.reconcile("search")
	s = f.server("search")
	if s.Status.Rotation == nil || s.Status.Rotation.CompletionTime == nil {
		t.Errorf("rotation = %+v; want it complete", s.Status.Rotation)
	}
	f.wantServing(s, 2)
	if c := f.condition(s, v1alpha1.ConditionServing); c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonServingLatest {
		t.Errorf("Serving = %s/%s; want True/ServingLatest", c.Status, c.Reason)
	}
	if !f.events.has("RevisionServing") {
		t.Errorf("events = %v; want RevisionServing", f.events.events)
	}
	if s.Status.DesiredReplicas != 1 || s.Status.UpdatedReadyReplicas != 1 {
		t.Errorf("rollout progress %d/%d, want 1/1", s.Status.UpdatedReadyReplicas, s.Status.DesiredReplicas)
	}
	if c := f.condition(s, v1alpha1.ConditionCredentialsReady); c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonCredentialsCurrent {
		t.Errorf("CredentialsReady = %s/%s; want True/CredentialsCurrent", c.Status, c.Reason)
	}
	if c := f.condition(s, v1alpha1.ConditionReady); c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonAvailable {
		t.Errorf("Ready = %s/%s; want True/Available", c.Status, c.Reason)
	}
}

// A spec change that reshapes the workload (here, the arguments) is a new
// config revision too, pending review: the Deployment keeps the reviewed
// pod template until a reviewer approves the new one.
func TestSpecChangeCreatesRevision(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.secret("search-token", "t")
	f.create(f.stdioServer("search"))
	f.reconcile("search")
	f.approve("search")
	f.reconcile("search")
	s := f.server("search")
	s.Spec.Args = []string{"--transport", "stdio", "--schema", "v2"}
	if err := k8s.Update(f.ctx, s); err != nil {
		t.Fatalf("update MCPServer: %v", err)
	}
	f.reconcile("search")
	s = f.server("search")
	revs := f.revisions(s.Status.ConnectionID)
	if len(revs) != 2 || s.Status.ConfigRevision != 2 || s.Status.Rotation != nil {
		t.Errorf("revisions %d, status revision %d, rotation %+v; want revision 2 and no rotation", len(revs), s.Status.ConfigRevision, s.Status.Rotation)
	}
	runs := func() string {
		var d appsv1.Deployment
		f.get("search", &d)
		return strings.Join(d.Spec.Template.Spec.Containers[0].Args, " ")
	}
	if strings.Contains(runs(), "--schema v2") {
		t.Errorf("the Deployment runs the unreviewed arguments: %s", runs())
	}
	if c := f.condition(s, v1alpha1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonConnectionPending {
		t.Errorf("Ready = %s/%s; want False/ConnectionPendingReview", c.Status, c.Reason)
	}
	f.approve("search")
	f.reconcile("search")
	if !strings.Contains(runs(), "--schema v2") {
		t.Errorf("after review the Deployment runs %s; want the new arguments", runs())
	}
}

// A missing Secret stops the reconcile with a clear condition; creating it
// lets the server register.
func TestMissingSecret(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.create(f.stdioServer("search"))
	f.reconcile("search")
	s := f.server("search")
	if c := f.condition(s, v1alpha1.ConditionCredentialsReady); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonSecretNotFound ||
		!strings.Contains(c.Message, `Secret "search-token" does not exist`) {
		t.Errorf("CredentialsReady = %+v; want False/SecretNotFound naming the Secret", c)
	}
	if s.Status.ConnectionID != "" {
		t.Errorf("connection %s registered without its Secret", s.Status.ConnectionID)
	}
	f.secret("search-token", "t")
	f.reconcile("search")
	if s = f.server("search"); s.Status.ConnectionID == "" {
		t.Errorf("no connection after the Secret appeared")
	}
}

// Deleting an MCPServer retires its registry connection, keeps the
// connection's history readable, and removes the finalizer.
func TestDeletionRetiresConnection(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.secret("search-token", "t")
	f.create(f.stdioServer("search"))
	f.reconcile("search")
	s := f.server("search")
	id := s.Status.ConnectionID
	if err := k8s.Delete(f.ctx, s); err != nil {
		t.Fatalf("delete: %v", err)
	}
	f.reconcile("search")

	err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "search"}, &v1alpha1.MCPServer{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("get after delete = %v; want NotFound (finalizer removed)", err)
	}
	conn, err := registry.GetConnection(f.ctx, &registryv1.GetConnectionRequest{Id: id})
	if err != nil {
		t.Fatalf("GetConnection after delete: %v", err)
	}
	if conn.GetState() != registryv1.ConnectionState_CONNECTION_STATE_RETIRED {
		t.Errorf("connection state = %v; want RETIRED", conn.GetState())
	}
	if n := len(f.revisions(id)); n != 1 {
		t.Errorf("config revisions after retire = %d; want the history (1) readable", n)
	}
	if !f.events.has("Retired") {
		t.Errorf("events = %v; want Retired", f.events.events)
	}
}

// A connection rejected in review never gets a Deployment, and Ready says
// why.
func TestRejectedConnectionStartsNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.secret("search-token", "t")
	f.create(f.stdioServer("search"))
	f.reconcile("search")
	id := f.server("search").Status.ConnectionID
	if _, err := services.Registry.ReviewConnection(services.As(f.ctx, "rita@review", "reviewers"), &registryv1.ReviewConnectionRequest{
		ConnectionId: id, ConfigRevision: 1, Approve: false, Note: "unknown publisher"}); err != nil {
		t.Fatal(err)
	}
	f.reconcile("search")
	s := f.server("search")
	if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "search"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Errorf("Deployment get = %v; want none for a rejected connection", err)
	}
	if c := f.condition(s, v1alpha1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonConnectionRejected ||
		!strings.Contains(c.Message, "rita@review") {
		t.Errorf("Ready = %+v; want False/ConnectionRejected naming the reviewer", c)
	}
	if !f.events.has(v1alpha1.ReasonConnectionRejected) {
		t.Errorf("events = %v; want ConnectionRejected", f.events.events)
	}
}

// A create whose status write was lost (the connection exists, the status
// does not name it) is found again by its endpoint, not created twice.
func TestLostStatusWriteFindsItsConnection(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.secret("search-token", "v1")
	f.create(f.stdioServer("search"))
	f.reconcile("search")
	s := f.server("search")
	id := s.Status.ConnectionID
	if id == "" {
		t.Fatal("the first reconcile registered no connection")
	}
	s.Status.ConnectionID = ""
	if err := k8s.Status().Update(f.ctx, s); err != nil {
		t.Fatal(err)
	}
	f.reconcile("search")
	if got := f.server("search").Status.ConnectionID; got != id {
		t.Fatalf("after a lost status write the server names connection %q, want %q again", got, id)
	}
	list, err := registry.ListConnections(f.ctx, &registryv1.ListConnectionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range list.GetConnections() {
		if strings.Contains(c.GetTransport().GetStreamableHttp().GetUrl(), "."+f.ns+".") {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d connections for the server, want 1", n)
	}
}

// TestStatusWriteLostForReal loses the status write of the reconcile that
// registered the connection, through the API server client itself (the
// update fails once, as a conflict would), so the status never names the
// connection. The next reconcile finds the connection by its endpoint:
// one connection, and the status names it.
func TestStatusWriteLostForReal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.secret("search-token", "v1")
	f.create(f.stdioServer("search"))
	base, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	var lost atomic.Int32
	f.r.Client = interceptor.NewClient(base, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if s, ok := obj.(*v1alpha1.MCPServer); ok && sub == "status" && s.Namespace == f.ns && s.Status.ConnectionID != "" && lost.CompareAndSwap(0, 1) {
				return apierrors.NewConflict(v1alpha1.GroupVersion.WithResource("mcpservers").GroupResource(), s.Name, errors.New("status write lost in the test"))
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
	_, err = f.r.Reconcile(f.ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: f.ns, Name: "search"}})
	if err == nil || lost.Load() != 1 {
		t.Fatalf("reconcile = %v, lost writes %d; want the status write lost once", err, lost.Load())
	}
	if id := f.server("search").Status.ConnectionID; id != "" {
		t.Fatalf("the lost status write is stored: connection %q", id)
	}
	endpointConns := func() []*registryv1.Connection {
		t.Helper()
		list, err := registry.ListConnections(f.ctx, &registryv1.ListConnectionsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var out []*registryv1.Connection
		for _, c := range list.GetConnections() {
			if strings.Contains(c.GetTransport().GetStreamableHttp().GetUrl(), "."+f.ns+".") {
				out = append(out, c)
			}
		}
		return out
	}
	before := endpointConns()
	if len(before) != 1 {
		t.Fatalf("%d connections registered before the retry, want 1", len(before))
	}
	f.reconcile("search")
	after := endpointConns()
	if len(after) != 1 {
		t.Fatalf("%d connections after the retry, want 1 (no duplicate)", len(after))
	}
	if got := f.server("search").Status.ConnectionID; got != before[0].GetId() {
		t.Errorf("after the retry the status names connection %q, want %q", got, before[0].GetId())
	}
}

// A rotation whose pods never become available (the server refuses the
// new credential, so its readiness probe never passes) fails: by the
// Deployment controller's progress deadline, or by the operator's own
// bound when the Deployment does not say so. The previous revision keeps
// serving in the registry; the status, a Warning event and the registry's
// record say why. A later rotation whose pods roll out serves again.
func TestFailedRotationKeepsServing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// fail makes the rollout fail; it may move the clock.
		fail func(f *fixture, d *appsv1.Deployment, clock *time.Time)
		want string
	}{
		{
			name: "progress deadline exceeded",
			fail: func(f *fixture, d *appsv1.Deployment, _ *time.Time) {
				d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 2, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1,
					UnavailableReplicas: 1, Conditions: []appsv1.DeploymentCondition{{
						Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded",
						Message: `ReplicaSet "search-7d9" has timed out progressing.`}}}
				f.setDeploymentStatus(d)
			},
			want: "ProgressDeadlineExceeded",
		},
		{
			name: "not available within the operator's bound",
			fail: func(_ *fixture, _ *appsv1.Deployment, clock *time.Time) { *clock = clock.Add(11 * time.Minute) },
			want: "not available within 10m0s",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			clock := time.Now()
			var mu sync.Mutex
			f.r.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
			sec := f.secret("search-token", "old-token")
			f.create(f.stdioServer("search"))
			f.reconcile("search")
			f.approve("search")
			f.reconcile("search")
			var d appsv1.Deployment
			f.get("search", &d)
			d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
			f.setDeploymentStatus(&d)
			f.reconcile("search")
			f.wantServing(f.server("search"), 1)

			sec.StringData = map[string]string{"token": "refused-token"}
			if err := k8s.Update(f.ctx, sec); err != nil {
				t.Fatalf("rotate Secret: %v", err)
			}
			if res := f.reconcile("search"); res.RequeueAfter <= 0 || res.RequeueAfter > controller.DefaultRolloutTimeout {
				t.Errorf("requeue after %v while the rotation rolls out; want within the rollout bound", res.RequeueAfter)
			}
			f.get("search", &d)
			mu.Lock()
			tc.fail(f, &d, &clock)
			mu.Unlock()
			f.reconcile("search")

			s := f.server("search")
			f.wantServing(s, 1)
			if s.Status.ConfigRevision != 2 || s.Status.Rotation == nil || s.Status.Rotation.CompletionTime != nil ||
				!strings.Contains(s.Status.Rotation.Failure, tc.want) {
				t.Fatalf("status revision %d rotation %+v; want 1 -> 2 failed with %q", s.Status.ConfigRevision, s.Status.Rotation, tc.want)
			}
			for _, typ := range []string{v1alpha1.ConditionServing, v1alpha1.ConditionCredentialsReady} {
				if c := f.condition(s, typ); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonRotationFailed ||
					!strings.Contains(c.Message, "revision 1 keeps serving") {
					t.Errorf("%s = %s/%s %q; want False/RotationFailed saying revision 1 keeps serving", typ, c.Status, c.Reason, c.Message)
				}
			}
			if !f.events.has(v1alpha1.ReasonRotationFailed) {
				t.Errorf("events = %v; want RotationFailed", f.events.events)
			}
			conn, err := registry.GetConnection(f.ctx, &registryv1.GetConnectionRequest{Id: s.Status.ConnectionID})
			if err != nil {
				t.Fatal(err)
			}
			if fl := conn.GetRolloutFailure(); fl.GetConfigRevision() != 2 || !strings.Contains(fl.GetDetail(), tc.want) {
				t.Errorf("registry rollout failure = %v; want revision 2 with %q", fl, tc.want)
			}
			// Reconciling again reports nothing new.
			before := len(f.events.events)
			f.reconcile("search")
			if n := len(f.events.events) - before; n != 0 {
				t.Errorf("a second reconcile of the failed rotation emitted %d events: %v", n, f.events.events[before:])
			}

			// The Secret is fixed: the next rotation's pods roll out and it serves.
			sec.StringData = map[string]string{"token": "good-token"}
			if err := k8s.Update(f.ctx, sec); err != nil {
				t.Fatalf("rotate Secret again: %v", err)
			}
			f.reconcile("search")
			f.get("search", &d)
			d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
			f.setDeploymentStatus(&d)
			f.reconcile("search")
			s = f.server("search")
			f.wantServing(s, 3)
			if c := f.condition(s, v1alpha1.ConditionServing); c.Status != metav1.ConditionTrue {
				t.Errorf("Serving after a good rotation = %s/%s", c.Status, c.Reason)
			}
			if c := f.condition(s, v1alpha1.ConditionCredentialsReady); c.Status != metav1.ConditionTrue {
				t.Errorf("CredentialsReady after a good rotation = %s/%s %q", c.Status, c.Reason, c.Message)
			}
		})
	}
}

// setDeploymentStatus writes d's status as the Deployment controller would
// (envtest runs none).
func (f *fixture) setDeploymentStatus(d *appsv1.Deployment) {
	f.t.Helper()
	if err := k8s.Status().Update(f.ctx, d); err != nil {
		f.t.Fatalf("update Deployment status: %v", err)
	}
}
