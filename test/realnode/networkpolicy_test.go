package realnode_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	"github.com/v0m3/v0m3/operator/controller"
)

// The NetworkPolicy the operator writes for an MCPServer is enforced on the
// node (by kube-router's firewall): a pod of the server reaches the address
// and port its egress allow-list names and nothing else, while a pod the
// policy does not select reaches the same forbidden address (so the refusal
// is the policy's, not the network's); and only the adapter's pods reach the
// server, not a pod elsewhere.
func TestNetworkPolicyFencesTheServer(t *testing.T) {
	t.Parallel()
	needNode(t)
	targets := namespace(t)
	allowed := targetPod(t, targets, "allowed")
	forbidden := targetPod(t, targets, "forbidden")

	ns := namespace(t)
	s := apply(t, &v1alpha1.MCPServer{
		ObjectMeta: metav1.ObjectMeta{Name: "fenced", Namespace: ns},
		Spec: v1alpha1.MCPServerSpec{
			Image:     fixtureImage,
			Transport: v1alpha1.TransportSpec{Type: v1alpha1.TransportStreamableHTTP, Port: 8080, Path: "/mcp"},
			Command:   []string{fixturePath},
			Args:      []string{"fixture-server", "--transport", "http", "--addr", ":8080"},
			Sandbox:   v1alpha1.SandboxSpec{Egress: []v1alpha1.EgressRule{{CIDR: allowed + "/32", Ports: []int32{8080}}}},
			Owner:     "team-sources",
		},
	})
	fenced := s.runningPod(s.approveIfPending().GetConfigRevision()).Status.PodIP + ":8080"
	waitFor(t, "the operator's NetworkPolicy", time.Minute, func() (bool, string) {
		err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "fenced"}, &networkingv1.NetworkPolicy{})
		return err == nil, fmt.Sprint(err)
	})

	adapterNS := adapterNamespace(t)
	server := map[string]string{controller.LabelServer: "fenced"}
	adapter := map[string]string{"app.kubernetes.io/name": "v0m3", "app.kubernetes.io/component": "adapter"}
	tests := []struct {
		name   string
		ns     string
		labels map[string]string
		target string
		open   bool
	}{
		{"the server to its allowed egress", ns, server, allowed + ":8080", true},
		{"the server to an address not allowed", ns, server, forbidden + ":8080", false},
		{"an unselected pod to that address", ns, nil, forbidden + ":8080", true},
		{"an adapter pod to the server", adapterNS, adapter, fenced, true},
		{"a pod in another namespace to the server", targets, nil, fenced, false},
		{"an adapter-labelled pod outside the adapter's namespace to the server", targets, adapter, fenced, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := probe(t, tt.ns, fmt.Sprintf("probe-%d", i), tt.labels, tt.target)
			if got != tt.open {
				t.Errorf("connection to %s open = %v; want %v", tt.target, got, tt.open)
			}
		})
	}
}

// adapterNamespace creates v0m3-system, where the operator's NetworkPolicies
// admit the adapter's pods from, for as long as the test runs. Only this
// test uses it.
func adapterNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "v0m3-system", Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted",
	}}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatalf("create namespace v0m3-system: %v", err)
	}
	t.Cleanup(func() {
		if err := k8s.Delete(context.Background(), ns); err != nil {
			t.Errorf("delete namespace v0m3-system: %v", err)
		}
	})
	return ns.Name
}

// restrictedContainer is a container under the restricted Pod Security
// Standard, which the tests' namespaces enforce.
func restrictedContainer(name, image string, args ...string) corev1.Container {
	return corev1.Container{
		Name: name, Image: image, Args: args,
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot: to(true), RunAsUser: to[int64](65532),
			AllowPrivilegeEscalation: to(false), ReadOnlyRootFilesystem: to(true),
			Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}

// createPod creates pod, retrying while the namespace's default
// ServiceAccount does not exist yet (the controller manager makes it).
func createPod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	pod.Spec.AutomountServiceAccountToken = to(false)
	waitFor(t, "pod "+pod.Name+" created", time.Minute, func() (bool, string) {
		err := k8s.Create(context.Background(), pod)
		return err == nil, fmt.Sprint(err)
	})
}

// targetPod runs the HTTP fixture as a plain pod (no policy selects it) and
// returns its address once it is ready.
func targetPod(t *testing.T, ns, name string) string {
	t.Helper()
	c := restrictedContainer("server", fixtureImage, "fixture-server", "--transport", "http", "--addr", ":8080")
	c.Command = []string{fixturePath}
	c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.PodSpec{Containers: []corev1.Container{c}}}
	createPod(t, pod)
	var ip string
	waitFor(t, "target pod "+name+" ready", podTimeout, func() (bool, string) {
		var p corev1.Pod
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(pod), &p); err != nil {
			return false, err.Error()
		}
		ip = p.Status.PodIP
		return ready(&p) && ip != "", string(p.Status.Phase) + " " + waiting(&p)
	})
	return ip
}

// probe runs the probe binary in a pod with labels, dialing target, and
// reports whether the connection opened.
func probe(t *testing.T, ns, name string, labels map[string]string, target string) bool {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{restrictedContainer("probe", probeImage, target)},
		},
	}
	createPod(t, pod)
	var phase corev1.PodPhase
	waitFor(t, "probe "+name+" to finish", podTimeout, func() (bool, string) {
		var p corev1.Pod
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(pod), &p); err != nil {
			return false, err.Error()
		}
		phase = p.Status.Phase
		return phase == corev1.PodSucceeded || phase == corev1.PodFailed, string(phase) + " " + waiting(&p)
	})
	return phase == corev1.PodSucceeded
}

func to[T any](v T) *T { return &v }
