// Package chart_test renders the Helm chart in this directory with the Helm
// CLI that scripts/helm.sh builds from the Go module proxy, once for each
// store, and checks the manifests: the restricted Pod Security Standard,
// wiring between services, Redis durability, the operator's RBAC and the
// NetworkPolicy labels it writes. identity_test.go checks identity and
// enforcement: certificates, NetworkPolicies, the Redis password, caller
// authentication.
package chart_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/v0m3/v0m3/internal/testkit"
)

const (
	release   = "rel"
	namespace = "v0m3-test"
)

// ports mirrors values.yaml and cmd/v0m3/serve.go's defaults.
var ports = map[string]int{
	"orchestrator": 7400,
	"registry":     7401,
	"policy":       7402,
	"evidence":     7403,
	"adapter":      7404,
}

var serviceNames = []string{"orchestrator", "registry", "policy", "evidence", "adapter"}

// helmBinary finds the Helm CLI: $V0M3_HELM, else where scripts/helm.sh
// caches it. Without CI a missing binary skips (loudly); under CI it fails,
// since `make test` builds it first (`make chart`).
func helmBinary(t *testing.T) string {
	t.Helper()
	testkit.NeedsExternal(t, "the Helm CLI (make chart)")
	bin := os.Getenv("V0M3_HELM")
	if bin == "" {
		out, err := exec.Command("bash", "../../scripts/helm.sh", "--path").Output()
		if err != nil {
			t.Fatalf("scripts/helm.sh --path: %v", err)
		}
		bin = strings.TrimSpace(string(out))
	}
	if _, err := os.Stat(bin); err != nil {
		msg := fmt.Sprintf("helm not found at %s (%v); run `bash scripts/helm.sh` (or `make chart`) to build it", bin, err)
		if os.Getenv("CI") == "" {
			t.Skip("SKIPPING THE HELM CHART TESTS: " + msg)
		}
		t.Fatal(msg)
	}
	return bin
}

func helm(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s\n%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return out
}

// manifests is a rendered chart, indexed by kind and name.
type manifests map[string]map[string][]byte

func (m manifests) get(t *testing.T, kind, name string, into any) bool {
	t.Helper()
	doc, ok := m[kind][name]
	if !ok {
		return false
	}
	if err := yaml.Unmarshal(doc, into); err != nil {
		t.Fatalf("%s %s: %v", kind, name, err)
	}
	return true
}

func (m manifests) must(t *testing.T, kind, name string, into any) {
	t.Helper()
	if !m.get(t, kind, name, into) {
		t.Fatalf("no %s %q rendered; have %v", kind, name, m.names(kind))
	}
}

func (m manifests) names(kind string) []string {
	var out []string
	for n := range m[kind] {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func render(t *testing.T, bin string, set ...string) manifests {
	t.Helper()
	args := []string{"template", release, ".", "--namespace", namespace, "--include-crds"}
	for _, s := range set {
		if strings.HasPrefix(s, "--") {
			args = append(args, s) // e.g. --values=file
		} else {
			args = append(args, "--set", s)
		}
	}
	out := helm(t, bin, args...)
	m := manifests{}
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		if meta.Kind == "" {
			continue // an empty document
		}
		if m[meta.Kind] == nil {
			m[meta.Kind] = map[string][]byte{}
		}
		if _, dup := m[meta.Kind][meta.Metadata.Name]; dup {
			t.Errorf("%s %q rendered twice", meta.Kind, meta.Metadata.Name)
		}
		m[meta.Kind][meta.Metadata.Name] = doc
	}
	return m
}

func TestLint(t *testing.T) {
	bin := helmBinary(t)
	for _, store := range []string{"file", "redis"} {
		helm(t, bin, "lint", ".", "--strict", "--set", "store="+store)
	}
}

func TestFileStore(t *testing.T) {
	m := render(t, helmBinary(t), "store=file")
	checkCommon(t, m)
	want := "file:///var/lib/v0m3"
	for _, name := range serviceNames {
		d := deployment(t, m, name)
		checkWiring(t, m, d, name, want)
		if got := *d.Spec.Replicas; got != 1 {
			t.Errorf("%s: file store with %d replicas; want 1", name, got)
		}
		if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
			t.Errorf("%s: file store with strategy %q; want Recreate (one writer at a time)", name, d.Spec.Strategy.Type)
		}
		checkDataVolume(t, m, d, name, true)
	}
	if len(m["StatefulSet"]) != 0 {
		t.Errorf("store=file renders StatefulSets %v; want no Redis", m.names("StatefulSet"))
	}
	// The file store with persistence off keeps data in an emptyDir.
	m = render(t, helmBinary(t), "store=file", "persistence.enabled=false")
	for _, name := range serviceNames {
		checkDataVolume(t, m, deployment(t, m, name), name, false)
	}
	if n := len(m["PersistentVolumeClaim"]); n != 0 {
		t.Errorf("persistence.enabled=false renders %d PVCs", n)
	}
}

func TestRedisStore(t *testing.T) {
	m := render(t, helmBinary(t), "store=redis", "services.registry.replicas=3")
	checkCommon(t, m)
	want := "redis://:$(V0M3_REDIS_PASSWORD)@" + release + "-redis:6379/0?prefix=" + release
	for _, name := range serviceNames {
		d := deployment(t, m, name)
		checkWiring(t, m, d, name, want)
		// Evidence keeps content assets on its ReadWriteOnce volume.
		persistent := name == "evidence"
		checkDataVolume(t, m, d, name, persistent)
		wantReplicas := int32(2)
		switch name {
		case "registry":
			wantReplicas = 3
		case "evidence":
			wantReplicas = 1
		}
		if got := *d.Spec.Replicas; got != wantReplicas {
			t.Errorf("%s: %d replicas with store=redis; want %d", name, got, wantReplicas)
		}
		// Calls between services are bounded as the values say.
		if got := flagValue(t, name, d.Spec.Template.Spec.Containers[0].Args, "internal-call-timeout"); got != "10s" {
			t.Errorf("%s --internal-call-timeout=%s; want 10s", name, got)
		}
		// Each caller's requests are admitted at the default rate.
		args := d.Spec.Template.Spec.Containers[0].Args
		if r, b, g := flagValue(t, name, args, "caller-rate"), flagValue(t, name, args, "caller-burst"), flagValue(t, name, args, "caller-rate-groups"); r != "50" || b != "100" || g != "product-services=1000:2000" {
			t.Errorf("%s --caller-rate=%s --caller-burst=%s --caller-rate-groups=%s; want 50, 100 and product-services=1000:2000", name, r, b, g)
		}
	}
	limited := render(t, helmBinary(t), "callerRateLimit.perSecond=0.5", "callerRateLimit.burst=3",
		"callerRateLimit.groups.product-services.perSecond=0", "callerRateLimit.groups.batch.perSecond=2.5", "callerRateLimit.groups.batch.burst=5")
	for _, name := range serviceNames {
		args := deployment(t, limited, name).Spec.Template.Spec.Containers[0].Args
		if r, b, g := flagValue(t, name, args, "caller-rate"), flagValue(t, name, args, "caller-burst"), flagValue(t, name, args, "caller-rate-groups"); r != "0.5" || b != "3" || g != "batch=2.5:5,product-services=0:2000" {
			t.Errorf("%s with callerRateLimit 0.5/3: --caller-rate=%s --caller-burst=%s --caller-rate-groups=%s", name, r, b, g)
		}
	}

	// The policy service charges its default budgets unless the values
	// say otherwise; large limits render as integers.
	for _, a := range deployment(t, m, "policy").Spec.Template.Spec.Containers[0].Args {
		if strings.Contains(a, "-budget-") {
			t.Errorf("policy renders %s with no budget in the values", a)
		}
	}
	budgets := deployment(t, render(t, helmBinary(t), "policy.budgets.task.calls=100", "policy.budgets.requester.responseBytes=134217728",
		"policy.budgets.requester.calls=2000", "policy.budgets.requester.period=168h"), "policy").Spec.Template.Spec.Containers[0].Args
	for flag, want := range map[string]string{"task-budget-calls": "100", "requester-budget-calls": "2000",
		"requester-budget-bytes": "134217728", "requester-budget-period": "168h"} {
		if got := flagValue(t, "policy", budgets, flag); got != want {
			t.Errorf("policy --%s=%s; want %s", flag, got, want)
		}
	}

	// Orchestrator replicas own requests under their pod names, with the
	// configured lease and recovery interval.
	o := deployment(t, m, "orchestrator").Spec.Template.Spec.Containers[0]
	if ttl, every := flagValue(t, "orchestrator", o.Args, "lease-ttl"), flagValue(t, "orchestrator", o.Args, "recovery-interval"); ttl != "30s" || every != "10s" {
		t.Errorf("orchestrator --lease-ttl=%s --recovery-interval=%s; want 30s and 10s", ttl, every)
	}
	if !slices.ContainsFunc(o.Env, func(e corev1.EnvVar) bool {
		return e.Name == "V0M3_REPLICA_ID" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
	}) {
		t.Errorf("orchestrator env %v; want V0M3_REPLICA_ID from the pod name", o.Env)
	}

	var sts appsv1.StatefulSet
	m.must(t, "StatefulSet", release+"-redis", &sts)
	if len(sts.Spec.VolumeClaimTemplates) == 0 {
		t.Error("redis StatefulSet has no volumeClaimTemplates")
	}
	c := sts.Spec.Template.Spec.Containers[0]
	argv := strings.Join(append(slices.Clone(c.Command), c.Args...), " ")
	for _, want := range []string{"redis-server", "--appendonly yes", "--appendfsync everysec", "--dir /data", "--maxmemory-policy noeviction"} {
		if !strings.Contains(argv, want) {
			t.Errorf("redis runs %q; want it to contain %q", argv, want)
		}
	}
	if strings.Contains(argv, "--maxmemory ") {
		t.Errorf("redis runs %q; want no maxmemory unless the values set one", argv)
	}
	var bounded appsv1.StatefulSet
	render(t, helmBinary(t), "store=redis", "redis.maxmemory=3gb").must(t, "StatefulSet", release+"-redis", &bounded)
	if c := bounded.Spec.Template.Spec.Containers[0]; !strings.Contains(strings.Join(c.Args, " "), "--maxmemory 3gb") {
		t.Errorf("redis with redis.maxmemory=3gb runs %v", c.Args)
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(v corev1.VolumeMount) bool { return v.Name == "data" && v.MountPath == "/data" }) {
		t.Errorf("redis mounts %v; want its claim at /data", c.VolumeMounts)
	}
	var svc corev1.Service
	m.must(t, "Service", release+"-redis", &svc)
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 6379 {
		t.Errorf("redis Service ports %v; want 6379", svc.Spec.Ports)
	}
	var sa corev1.ServiceAccount
	m.must(t, "ServiceAccount", sts.Spec.Template.Spec.ServiceAccountName, &sa)
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Error("redis ServiceAccount automounts its token")
	}

	// An external Redis keeps its URL and gets the prefix; no StatefulSet.
	m = render(t, helmBinary(t), "store=redis", "redis.enabled=false", "redis.url=rediss://redis.example:6380/2", "redisPrefix=prod")
	for _, name := range serviceNames {
		checkWiring(t, m, deployment(t, m, name), name, "rediss://redis.example:6380/2?prefix=prod")
	}
	if len(m["StatefulSet"]) != 0 {
		t.Errorf("redis.enabled=false renders StatefulSets %v", m.names("StatefulSet"))
	}
}

func TestPolicyIsTheBuiltInDefault(t *testing.T) {
	copied, err := os.ReadFile("files/default.cedar")
	if err != nil {
		t.Fatal(err)
	}
	builtin, err := os.ReadFile("../../services/policy/default.cedar")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(copied, builtin) {
		t.Fatal("charts/v0m3/files/default.cedar differs from services/policy/default.cedar; copy it again")
	}
	m := render(t, helmBinary(t))
	var cm corev1.ConfigMap
	m.must(t, "ConfigMap", release+"-policy", &cm)
	if strings.TrimSpace(cm.Data["policy.cedar"]) != strings.TrimSpace(string(builtin)) {
		t.Error("the policy ConfigMap does not hold the built-in default policy")
	}
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte("policy:\n  cedar: |\n    forbid (principal, action, resource);\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m = render(t, helmBinary(t), "--values="+values)
	m.must(t, "ConfigMap", release+"-policy", &cm)
	if got := strings.TrimSpace(cm.Data["policy.cedar"]); got != "forbid (principal, action, resource);" {
		t.Errorf("policy.cedar from values renders %q", got)
	}
}

func deployment(t *testing.T, m manifests, name string) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	m.must(t, "Deployment", release+"-"+name, &d)
	return &d
}

// checkCommon checks what holds for either store: every pod is restricted,
// service pods mount no token, every v0m3 container mounts its certificate,
// the operator is bound to its ClusterRole and writes NetworkPolicies that
// admit the adapter's pods.
func checkCommon(t *testing.T, m manifests) {
	t.Helper()
	if len(m["CustomResourceDefinition"]) == 0 {
		t.Error("no CRDs rendered")
	}
	checkDefinitionCRDs(t, m)
	pods := 0
	for _, name := range m.names("Deployment") {
		var d appsv1.Deployment
		m.must(t, "Deployment", name, &d)
		checkRestricted(t, "Deployment "+name, &d.Spec.Template.Spec)
		pods++
	}
	for _, name := range m.names("StatefulSet") {
		var s appsv1.StatefulSet
		m.must(t, "StatefulSet", name, &s)
		checkRestricted(t, "StatefulSet "+name, &s.Spec.Template.Spec)
		pods++
	}
	if pods != len(serviceNames)+1+len(m["StatefulSet"]) {
		t.Errorf("%d workloads rendered: %v %v", pods, m.names("Deployment"), m.names("StatefulSet"))
	}

	for _, name := range serviceNames {
		d := deployment(t, m, name)
		spec := d.Spec.Template.Spec
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			t.Errorf("%s: pod automounts a service account token", name)
		}
		if spec.ServiceAccountName != release+"-"+name {
			t.Errorf("%s: service account %q; want its own", name, spec.ServiceAccountName)
		}
		var sa corev1.ServiceAccount
		m.must(t, "ServiceAccount", spec.ServiceAccountName, &sa)
		if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			t.Errorf("%s: ServiceAccount automounts its token", name)
		}
	}

	for _, name := range append(slices.Clone(serviceNames), "operator") {
		checkTLS(t, m, deployment(t, m, name), name, release+"-"+name+"-tls")
	}

	// The operator: its own ServiceAccount, bound to the generated ClusterRole.
	op := deployment(t, m, "operator")
	opSA := op.Spec.Template.Spec.ServiceAccountName
	var sa corev1.ServiceAccount
	m.must(t, "ServiceAccount", opSA, &sa)
	var role rbacv1.ClusterRole
	m.must(t, "ClusterRole", "v0m3-operator", &role)
	bound := false
	for _, name := range m.names("ClusterRoleBinding") {
		var b rbacv1.ClusterRoleBinding
		m.must(t, "ClusterRoleBinding", name, &b)
		if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != "v0m3-operator" || b.RoleRef.APIGroup != rbacv1.GroupName {
			continue
		}
		for _, s := range b.Subjects {
			if s.Kind == rbacv1.ServiceAccountKind && s.Name == opSA && s.Namespace == namespace {
				bound = true
			}
		}
	}
	if !bound {
		t.Errorf("no ClusterRoleBinding binds ClusterRole v0m3-operator to ServiceAccount %s/%s", namespace, opSA)
	}

	// The operator's flags match the registry Service and the adapter pods.
	args := op.Spec.Template.Spec.Containers[0].Args
	if args[0] != "operator" {
		t.Errorf("operator runs %v", args)
	}
	reg := flagValue(t, "operator", args, "registry")
	if want := fmt.Sprintf("%s-registry:%d", release, ports["registry"]); reg != want {
		t.Errorf("operator --registry=%s; want %s", reg, want)
	}
	checkServiceAddr(t, m, "operator", reg)
	if ns := flagValue(t, "operator", args, "adapter-namespace"); ns != namespace {
		t.Errorf("operator --adapter-namespace=%s; want the release namespace %s", ns, namespace)
	}
	adapterLabels := deployment(t, m, "adapter").Spec.Template.Labels
	for _, kv := range strings.Split(flagValue(t, "operator", args, "adapter-labels"), ",") {
		k, v, _ := strings.Cut(kv, "=")
		if adapterLabels[k] != v {
			t.Errorf("operator admits adapter pods labelled %s=%s; the adapter's pods have %v", k, v, adapterLabels)
		}
	}
	for _, other := range serviceNames {
		if other == "adapter" {
			continue
		}
		l := deployment(t, m, other).Spec.Template.Labels
		if l["app.kubernetes.io/component"] == adapterLabels["app.kubernetes.io/component"] {
			t.Errorf("%s's pods carry the adapter's component label", other)
		}
	}
	if img := flagValue(t, "operator", args, "bridge-image"); img != op.Spec.Template.Spec.Containers[0].Image {
		t.Errorf("operator --bridge-image=%s; want the v0m3 image %s", img, op.Spec.Template.Spec.Containers[0].Image)
	}
}

// checkRestricted checks the fields of the restricted Pod Security Standard.
func checkRestricted(t *testing.T, what string, spec *corev1.PodSpec) {
	t.Helper()
	psc := spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		t.Errorf("%s: uses host namespaces", what)
	}
	for _, v := range spec.Volumes {
		if v.EmptyDir == nil && v.PersistentVolumeClaim == nil && v.ConfigMap == nil && v.Secret == nil && v.Projected == nil {
			t.Errorf("%s: volume %s is of a type the restricted profile forbids", what, v.Name)
		}
	}
	podSeccomp := psc.SeccompProfile != nil && psc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault
	podNonRoot := psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
	if psc.RunAsUser != nil && *psc.RunAsUser == 0 {
		t.Errorf("%s: pod runs as uid 0", what)
	}
	containers := append(slices.Clone(spec.InitContainers), spec.Containers...)
	if len(containers) == 0 {
		t.Errorf("%s: no containers", what)
	}
	for _, c := range containers {
		w := what + " container " + c.Name
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("%s: no securityContext", w)
			continue
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: allowPrivilegeEscalation is not false", w)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s: privileged", w)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: readOnlyRootFilesystem is not true", w)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("%s: does not drop ALL capabilities", w)
		} else if len(sc.Capabilities.Add) > 0 {
			t.Errorf("%s: adds capabilities %v", w, sc.Capabilities.Add)
		}
		if !(sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) && !(sc.RunAsNonRoot == nil && podNonRoot) {
			t.Errorf("%s: runAsNonRoot is not true", w)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			t.Errorf("%s: runs as uid 0", w)
		}
		seccomp := podSeccomp
		if sc.SeccompProfile != nil {
			seccomp = sc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault
		}
		if !seccomp {
			t.Errorf("%s: seccomp profile is not RuntimeDefault", w)
		}
	}
}

// checkWiring checks one service's command: its store, its listen port and
// probes, and every peer's address, which must name that peer's Service.
func checkWiring(t *testing.T, m manifests, d *appsv1.Deployment, name, wantStore string) {
	t.Helper()
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: %d containers", name, len(spec.Containers))
	}
	c := spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != name {
		t.Errorf("%s: runs %v; want `v0m3 %s`", name, c.Args, name)
	}
	// The store URL is in the environment, where the kubelet can expand
	// the Redis password into it; never in argv, which other processes in
	// the pod can read.
	if got, ok := envValue(c, "V0M3_STORE"); !ok || got != wantStore {
		t.Errorf("%s: V0M3_STORE=%q (set %v); want %q", name, got, ok, wantStore)
	}
	if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--store") }) {
		t.Errorf("%s: args %v carry the store URL", name, c.Args)
	}
	if l := flagValue(t, name, c.Args, "listen"); l != fmt.Sprintf(":%d", ports[name]) {
		t.Errorf("%s: --listen=%s; want :%d", name, l, ports[name])
	}
	// TCP probes on the gRPC port: the kubelet's gRPC probes cannot do TLS.
	for _, p := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.GRPC != nil || p.TCPSocket == nil || p.TCPSocket.Port.String() != "grpc" {
			t.Errorf("%s: probe %+v; want a TCP probe of port grpc", name, p)
		}
	}
	// gRPC first; the metrics port (TestObservability) beside it.
	if len(c.Ports) < 1 || c.Ports[0].Name != "grpc" || int(c.Ports[0].ContainerPort) != ports[name] {
		t.Errorf("%s: container ports %v", name, c.Ports)
	}
	for _, peer := range serviceNames {
		if peer == name {
			if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--"+peer+"-addr") }) {
				t.Errorf("%s: passes its own address", name)
			}
			continue
		}
		addr := flagValue(t, name, c.Args, peer+"-addr")
		if want := fmt.Sprintf("%s-%s:%d", release, peer, ports[peer]); addr != want {
			t.Errorf("%s: --%s-addr=%s; want %s", name, peer, addr, want)
		}
		checkServiceAddr(t, m, name, addr)
	}
	if name == "policy" {
		checkPolicyMount(t, m, d)
	}
	// The Service selects exactly this service's pods.
	var svc corev1.Service
	m.must(t, "Service", release+"-"+name, &svc)
	for k, v := range svc.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("%s: Service selects %s=%s; pods have %v", name, k, v, d.Spec.Template.Labels)
		}
	}
	if svc.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("%s: Service type %q", name, svc.Spec.Type)
	}
}

// checkServiceAddr checks that host:port names a rendered Service port "grpc".
func checkServiceAddr(t *testing.T, m manifests, who, addr string) {
	t.Helper()
	host, port, _ := strings.Cut(addr, ":")
	var svc corev1.Service
	if !m.get(t, "Service", host, &svc) {
		t.Errorf("%s: address %s names no rendered Service", who, addr)
		return
	}
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		return p.Name == "grpc" && fmt.Sprint(p.Port) == port
	}) {
		t.Errorf("%s: address %s: Service %s has ports %v", who, addr, host, svc.Spec.Ports)
	}
}

func checkPolicyMount(t *testing.T, m manifests, d *appsv1.Deployment) {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	file := flagValue(t, "policy", c.Args, "policy-file")
	var cm corev1.ConfigMap
	m.must(t, "ConfigMap", release+"-policy", &cm)
	for _, vm := range c.VolumeMounts {
		if filepath.Dir(file) != vm.MountPath {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
				if _, ok := cm.Data[filepath.Base(file)]; ok {
					return
				}
			}
		}
	}
	t.Errorf("policy: --policy-file=%s is not a key of ConfigMap %s mounted there", file, cm.Name)
}

// checkDataVolume checks the --data-dir volume: a PVC or an emptyDir.
func checkDataVolume(t *testing.T, m manifests, d *appsv1.Deployment, name string, persistent bool) {
	t.Helper()
	spec := d.Spec.Template.Spec
	dir := flagValue(t, name, spec.Containers[0].Args, "data-dir")
	var vol string
	for _, vm := range spec.Containers[0].VolumeMounts {
		if vm.MountPath == dir {
			vol = vm.Name
		}
	}
	if vol == "" {
		t.Errorf("%s: nothing is mounted at --data-dir=%s (the root filesystem is read-only)", name, dir)
		return
	}
	for _, v := range spec.Volumes {
		if v.Name != vol {
			continue
		}
		switch {
		case persistent && v.PersistentVolumeClaim != nil:
			var pvc corev1.PersistentVolumeClaim
			m.must(t, "PersistentVolumeClaim", v.PersistentVolumeClaim.ClaimName, &pvc)
		case !persistent && v.EmptyDir != nil:
		default:
			t.Errorf("%s: data volume %+v; want persistent=%v", name, v.VolumeSource, persistent)
		}
	}
}

// envValue returns the literal value of a container's environment variable.
func envValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// flagValue returns the value of --name=value in args.
func flagValue(t *testing.T, who string, args []string, name string) string {
	t.Helper()
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	t.Errorf("%s: no --%s in %v", who, name, args)
	return ""
}

// checkDefinitionCRDs checks that the Capability and TaskProfile CRDs are
// rendered cluster-scoped with a status subresource (their names are
// global in the registry), and that the operator's generated ClusterRole
// lets it read them, write their status and finalizers, and nothing more
// of them (no create or delete: people declare, the operator carries).
func checkDefinitionCRDs(t *testing.T, m manifests) {
	t.Helper()
	for name, kind := range map[string]string{"capabilities.v0m3.dev": "Capability", "taskprofiles.v0m3.dev": "TaskProfile"} {
		var crd struct {
			Spec struct {
				Scope string `json:"scope"`
				Names struct {
					Kind string `json:"kind"`
				} `json:"names"`
				Versions []struct {
					Name         string         `json:"name"`
					Subresources map[string]any `json:"subresources"`
				} `json:"versions"`
			} `json:"spec"`
		}
		m.must(t, "CustomResourceDefinition", name, &crd)
		if crd.Spec.Scope != "Cluster" || crd.Spec.Names.Kind != kind || len(crd.Spec.Versions) != 1 ||
			crd.Spec.Versions[0].Name != "v1alpha1" || crd.Spec.Versions[0].Subresources["status"] == nil {
			t.Errorf("CRD %s = %+v; want kind %s, cluster-scoped, v1alpha1 with a status subresource", name, crd.Spec, kind)
		}
	}
	var role rbacv1.ClusterRole
	m.must(t, "ClusterRole", "v0m3-operator", &role)
	verbs := map[string][]string{}
	for _, r := range role.Rules {
		if !slices.Contains(r.APIGroups, "v0m3.dev") {
			continue
		}
		for _, res := range r.Resources {
			verbs[res] = append(verbs[res], r.Verbs...)
		}
	}
	for res, want := range map[string][]string{
		"capabilities": {"get", "list", "patch", "update", "watch"}, "capabilities/status": {"get", "patch", "update"}, "capabilities/finalizers": {"update"},
		"taskprofiles": {"get", "list", "patch", "update", "watch"}, "taskprofiles/status": {"get", "patch", "update"}, "taskprofiles/finalizers": {"update"},
	} {
		got := slices.Sorted(slices.Values(verbs[res]))
		if !slices.Equal(got, want) {
			t.Errorf("operator ClusterRole verbs on %s = %v; want %v", res, got, want)
		}
	}
}
