package chart_test

// Identity and enforcement in the chart (issue 12): NetworkPolicies that
// admit exactly the callers of the access table, Redis behind a password
// that only its Secret holds, a certificate for every component, plaintext
// only on request, and caller authentication settings.

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
)

// wantCallers is the access table (internal/identity) reduced to the
// network: who may open a connection to each component. "product" and
// "admin" are networkPolicy.productFrom and adminFrom; the orchestrator's
// bearer callers are product services and people, the other services'
// are admins. Derived from the table so the chart cannot drift from it.
var wantCallers = func() map[string][]string {
	out := map[string][]string{
		"operator": {},
		"redis":    {"orchestrator", "registry", "policy", "evidence", "adapter"},
	}
	for component, svc := range map[string]string{
		"orchestrator": "v0m3.orchestrator.v1.OrchestratorService",
		"registry":     "v0m3.registry.v1.RegistryService",
		"policy":       "v0m3.policy.v1.PolicyService",
		"evidence":     "v0m3.evidence.v1.EvidenceService",
		"adapter":      "v0m3.adapter.v1.AdapterService",
	} {
		callers := identity.CallersOf(svc)
		if identity.AdmitsCallers(svc) {
			if component == "orchestrator" {
				callers = append(callers, "product")
			}
			callers = append(callers, "admin")
		}
		out[component] = callers
	}
	return out
}()

// portOf is the port a component serves on.
func portOf(component string) int {
	if component == "redis" {
		return 6379
	}
	return ports[component]
}

// The default peers of values.yaml's productFrom and adminFrom.
var externalCallers = map[string]string{"product": "product", "admin": "admin"}

// podLabels returns the pod template labels of every rendered workload.
func podLabels(t *testing.T, m manifests) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	for _, name := range m.names("Deployment") {
		var d appsv1.Deployment
		m.must(t, "Deployment", name, &d)
		out[name] = d.Spec.Template.Labels
	}
	for _, name := range m.names("StatefulSet") {
		var s appsv1.StatefulSet
		m.must(t, "StatefulSet", name, &s)
		out[name] = s.Spec.Template.Labels
	}
	return out
}

func selects(t *testing.T, sel *metav1.LabelSelector, l map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %v: %v", sel, err)
	}
	return s.Matches(labels.Set(l))
}

// callerOf names the caller a NetworkPolicy peer admits: a component of
// this release, "product" or "admin". Anything else fails the test.
func callerOf(t *testing.T, who string, p networkingv1.NetworkPolicyPeer) string {
	t.Helper()
	switch {
	case p.IPBlock == nil && p.NamespaceSelector == nil && p.PodSelector != nil && len(p.PodSelector.MatchExpressions) == 0:
		l := p.PodSelector.MatchLabels
		if len(l) == 3 && l["app.kubernetes.io/name"] == "v0m3" && l["app.kubernetes.io/instance"] == release && l["app.kubernetes.io/component"] != "" {
			return l["app.kubernetes.io/component"]
		}
	case p.IPBlock == nil && p.PodSelector == nil && p.NamespaceSelector != nil && len(p.NamespaceSelector.MatchExpressions) == 0:
		l := p.NamespaceSelector.MatchLabels
		if len(l) == 1 && externalCallers[l["v0m3.dev/access"]] != "" {
			return externalCallers[l["v0m3.dev/access"]]
		}
	}
	t.Errorf("%s: NetworkPolicy admits an unexpected peer %+v", who, p)
	return ""
}

func TestNetworkPolicies(t *testing.T) {
	t.Parallel()
	m := render(t, helmBinary(t), "store=redis")
	pods := podLabels(t, m)

	// Ingress to every pod of the release is denied unless a rule admits it.
	var deny networkingv1.NetworkPolicy
	m.must(t, "NetworkPolicy", release+"-default-deny", &deny)
	if len(deny.Spec.Ingress) != 0 || !slices.Equal(deny.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("default-deny: policyTypes %v ingress %v; want Ingress with no rules", deny.Spec.PolicyTypes, deny.Spec.Ingress)
	}
	for w, l := range pods {
		if !selects(t, &deny.Spec.PodSelector, l) {
			t.Errorf("default-deny does not select %s's pods %v", w, l)
		}
	}

	for component, want := range wantCallers {
		var np networkingv1.NetworkPolicy
		m.must(t, "NetworkPolicy", release+"-"+component, &np)
		// It selects this component's pods and no other workload's.
		for w, l := range pods {
			if got, mine := selects(t, &np.Spec.PodSelector, l), w == release+"-"+component; got != mine {
				t.Errorf("%s: NetworkPolicy selects %s's pods: %v", component, w, got)
			}
		}
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			t.Errorf("%s: policyTypes %v lack Ingress", component, np.Spec.PolicyTypes)
		}
		var got []string
		for _, rule := range np.Spec.Ingress {
			if len(rule.From) == 0 {
				t.Errorf("%s: an ingress rule without peers admits everyone", component)
			}
			if len(rule.Ports) != 1 || rule.Ports[0].Port == nil || rule.Ports[0].Port.IntValue() != portOf(component) ||
				rule.Ports[0].Protocol == nil || *rule.Ports[0].Protocol != corev1.ProtocolTCP {
				t.Errorf("%s: ingress ports %v; want only TCP %d", component, rule.Ports, portOf(component))
			}
			for _, p := range rule.From {
				c := callerOf(t, component, p)
				got = append(got, c)
				// A peer component must have pods that its selector matches.
				if _, ok := wantCallers[c]; ok && !selects(t, p.PodSelector, pods[release+"-"+c]) {
					t.Errorf("%s: peer selector %v matches no pod of %s", component, p.PodSelector, c)
				}
			}
		}
		slices.Sort(got)
		want = slices.Sorted(slices.Values(want))
		if !slices.Equal(got, want) {
			t.Errorf("%s: NetworkPolicy admits %v; the access table says %v", component, got, want)
		}
	}

	// Redis opens no connection of its own.
	var np networkingv1.NetworkPolicy
	m.must(t, "NetworkPolicy", release+"-redis", &np)
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || len(np.Spec.Egress) != 0 {
		t.Errorf("redis: policyTypes %v egress %v; want all egress denied", np.Spec.PolicyTypes, np.Spec.Egress)
	}
	// The adapter's egress is open unless asked: MCP servers may be anywhere.
	for _, name := range m.names("NetworkPolicy") {
		m.must(t, "NetworkPolicy", name, &np)
		if name != release+"-redis" && slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
			t.Errorf("%s restricts egress by default", name)
		}
	}
}

// With no product or admin peers configured, nothing outside the release
// reaches the orchestrator: no rule at all, rather than a rule whose empty
// peer list would admit everyone.
func TestNetworkPoliciesWithoutExternalCallers(t *testing.T) {
	t.Parallel()
	m := render(t, helmBinary(t), "networkPolicy.productFrom=null", "networkPolicy.adminFrom=null")
	var np networkingv1.NetworkPolicy
	for _, component := range []string{"orchestrator", "operator"} {
		m.must(t, "NetworkPolicy", release+"-"+component, &np)
		if len(np.Spec.Ingress) != 0 {
			t.Errorf("%s: ingress %+v; want none", component, np.Spec.Ingress)
		}
	}
	m.must(t, "NetworkPolicy", release+"-evidence", &np)
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 4 {
		t.Errorf("evidence without admins: ingress %+v; want the orchestrator, adapter, registry and policy (audit records) only", np.Spec.Ingress)
	}
}

func TestAdapterEgress(t *testing.T) {
	t.Parallel()
	m := render(t, helmBinary(t), "store=redis", "networkPolicy.adapterEgress.enabled=true",
		"networkPolicy.adapterEgress.to[0].to[0].ipBlock.cidr=203.0.113.0/24",
		"networkPolicy.adapterEgress.to[0].ports[0].port=443")
	var np networkingv1.NetworkPolicy
	m.must(t, "NetworkPolicy", release+"-adapter-egress", &np)
	pods := podLabels(t, m)
	if !selects(t, &np.Spec.PodSelector, pods[release+"-adapter"]) || !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}) {
		t.Fatalf("adapter egress policy selects %v types %v", np.Spec.PodSelector, np.Spec.PolicyTypes)
	}
	// reaches: what each rule admits, by peer.
	reaches := func(l map[string]string, port int) bool {
		for _, r := range np.Spec.Egress {
			for _, p := range r.To {
				if p.PodSelector == nil || !selects(t, p.PodSelector, l) {
					continue
				}
				if len(r.Ports) == 0 || slices.ContainsFunc(r.Ports, func(pp networkingv1.NetworkPolicyPort) bool { return pp.Port.IntValue() == port }) {
					return true
				}
			}
		}
		return false
	}
	for _, peer := range []string{"registry", "policy", "evidence", "redis"} {
		if !reaches(pods[release+"-"+peer], portOf(peer)) {
			t.Errorf("adapter egress does not reach %s", peer)
		}
	}
	if reaches(pods[release+"-operator"], 8081) {
		t.Error("adapter egress reaches the operator")
	}
	if !reaches(map[string]string{"app.kubernetes.io/managed-by": "v0m3-operator"}, 8080) {
		t.Error("adapter egress does not reach the operator's MCP server pods")
	}
	if !slices.ContainsFunc(np.Spec.Egress, func(r networkingv1.NetworkPolicyEgressRule) bool {
		return len(r.To) == 1 && r.To[0].IPBlock != nil && r.To[0].IPBlock.CIDR == "203.0.113.0/24"
	}) {
		t.Errorf("adapter egress lacks the rule from values: %+v", np.Spec.Egress)
	}
}

// redisSecret returns the generated Redis password.
func redisSecret(t *testing.T, m manifests) string {
	t.Helper()
	var s corev1.Secret
	m.must(t, "Secret", release+"-redis-auth", &s)
	pw := string(s.Data["password"])
	if !regexp.MustCompile(`^[A-Za-z0-9]{32,}$`).MatchString(pw) {
		t.Fatalf("generated Redis password %q: want at least 32 letters and digits", pw)
	}
	return pw
}

func TestRedisPassword(t *testing.T) {
	t.Parallel()
	m := render(t, helmBinary(t), "store=redis")
	pw := redisSecret(t, m)

	// Only the Secret holds it, in no encoding that another manifest shows.
	for kind, docs := range m {
		for name, doc := range docs {
			if kind == "Secret" && name == release+"-redis-auth" {
				continue
			}
			for _, form := range []string{pw, base64.StdEncoding.EncodeToString([]byte(pw))} {
				if bytes.Contains(doc, []byte(form)) {
					t.Errorf("%s %s contains the Redis password", kind, name)
				}
			}
		}
	}

	ref := corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: release + "-redis-auth"}, Key: "password"}
	for _, name := range serviceNames {
		env := resolveEnv(t, name, deployment(t, m, name).Spec.Template.Spec.Containers[0], m)
		if want := "redis://:" + pw + "@" + release + "-redis:6379/0?prefix=" + release; env["V0M3_STORE"] != want {
			t.Errorf("%s: V0M3_STORE expands to %q; want the password from Secret %s", name, env["V0M3_STORE"], ref.Name)
		}
	}
	var sts appsv1.StatefulSet
	m.must(t, "StatefulSet", release+"-redis", &sts)
	c := sts.Spec.Template.Spec.Containers[0]
	env := resolveEnv(t, "redis", c, m)
	if env["REDIS_PASSWORD"] != pw || env["REDISCLI_AUTH"] != pw {
		t.Errorf("redis: REDIS_PASSWORD and REDISCLI_AUTH are not the Secret's password")
	}

	// The rendered command, run as the kubelet would with a real
	// redis-server: it refuses a client without the password and serves
	// the store URL the services get.
	addr := startRenderedRedis(t, c, env)
	ctx := context.Background()
	anon := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second})
	defer anon.Close()
	if err := anon.Set(ctx, "k", "v", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("redis without a password: SET returned %v; want NOAUTH", err)
	}
	store := resolveEnv(t, "orchestrator", deployment(t, m, "orchestrator").Spec.Template.Spec.Containers[0], m)["V0M3_STORE"]
	u, err := url.Parse(store)
	if err != nil {
		t.Fatal(err)
	}
	u.Host, u.RawQuery = addr, "" // the Service name, here; prefix is V0M3's own option
	opts, err := redis.ParseURL(u.String())
	if err != nil {
		t.Fatal(err)
	}
	opts.DialTimeout = time.Second
	authed := redis.NewClient(opts)
	defer authed.Close()
	if err := authed.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Errorf("redis with the services' store URL: %v", err)
	}

	// A password that would not survive a URL stops Redis before it
	// listens, with a message saying why.
	bad := maps.Clone(env)
	bad["REDIS_PASSWORD"] = "p@ss word"
	port := freePort(t)
	cmd := renderedRedisCommand(t, c, bad, t.TempDir(), port)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "password in the Secret must be") {
		t.Errorf("redis with a password unfit for a URL: err %v, output %q; want a refusal", err, out)
	}
	if conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second); err == nil {
		conn.Close()
		t.Error("redis listens after refusing its password")
	}
}

func TestRedisExistingSecret(t *testing.T) {
	t.Parallel()
	bin := helmBinary(t)
	ref := func(c corev1.Container, name string) *corev1.SecretKeySelector {
		for _, e := range c.Env {
			if e.Name == name && e.ValueFrom != nil {
				return e.ValueFrom.SecretKeyRef
			}
		}
		return nil
	}
	// The chart's Redis with your Secret: no generated one.
	m := render(t, bin, "store=redis", "redis.auth.existingSecret=mine", "redis.auth.existingSecretKey=pw")
	if len(m["Secret"]) != 0 {
		t.Errorf("existingSecret renders Secrets %v", m.names("Secret"))
	}
	var sts appsv1.StatefulSet
	m.must(t, "StatefulSet", release+"-redis", &sts)
	if r := ref(sts.Spec.Template.Spec.Containers[0], "REDIS_PASSWORD"); r == nil || r.Name != "mine" || r.Key != "pw" {
		t.Errorf("redis REDIS_PASSWORD from %+v; want mine/pw", r)
	}
	for _, name := range serviceNames {
		c := deployment(t, m, name).Spec.Template.Spec.Containers[0]
		if r := ref(c, "V0M3_REDIS_PASSWORD"); r == nil || r.Name != "mine" || r.Key != "pw" {
			t.Errorf("%s: V0M3_REDIS_PASSWORD from %+v; want mine/pw", name, r)
		}
	}

	// An external Redis: the password from your Secret goes into its URL.
	m = render(t, bin, "store=redis", "redis.enabled=false", "redis.url=rediss://redis.example:6380/2",
		"redis.auth.existingSecret=ext", "redis.auth.username=v0m3", "redisPrefix=prod")
	for _, name := range serviceNames {
		c := deployment(t, m, name).Spec.Template.Spec.Containers[0]
		if r := ref(c, "V0M3_REDIS_PASSWORD"); r == nil || r.Name != "ext" || r.Key != "password" {
			t.Errorf("%s: V0M3_REDIS_PASSWORD from %+v; want ext/password", name, r)
		}
		if got, _ := envValue(c, "V0M3_STORE"); got != "rediss://v0m3:$(V0M3_REDIS_PASSWORD)@redis.example:6380/2?prefix=prod" {
			t.Errorf("%s: V0M3_STORE=%q", name, got)
		}
	}

	// A password written into values would be rendered into every
	// Deployment: refused.
	for _, set := range [][]string{
		{"redis.url=redis://:hunter2@redis.example:6379/0"},
		{"redis.url=redis://app:hunter2@redis.example:6379/0"},
		{"redis.url=redis://app@redis.example:6379/0", "redis.auth.existingSecret=ext"},
	} {
		out := helmFails(t, bin, append([]string{"store=redis", "redis.enabled=false"}, set...)...)
		if strings.Contains(out, "hunter2") || !strings.Contains(out, "redis.auth") {
			t.Errorf("%v: error %q; want one pointing at redis.auth, without the password", set, out)
		}
	}
}

// certificate holds the fields of a cert-manager Certificate the tests read.
type certificate struct {
	Spec struct {
		SecretName string   `json:"secretName"`
		IsCA       bool     `json:"isCA"`
		URIs       []string `json:"uris"`
		DNSNames   []string `json:"dnsNames"`
		Usages     []string `json:"usages"`
		PrivateKey struct {
			Algorithm      string `json:"algorithm"`
			Size           int    `json:"size"`
			RotationPolicy string `json:"rotationPolicy"`
		} `json:"privateKey"`
		IssuerRef struct {
			Name  string `json:"name"`
			Kind  string `json:"kind"`
			Group string `json:"group"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

type issuer struct {
	Spec struct {
		SelfSigned *struct{} `json:"selfSigned"`
		CA         *struct {
			SecretName string `json:"secretName"`
		} `json:"ca"`
	} `json:"spec"`
}

func TestCertificates(t *testing.T) {
	t.Parallel()
	bin := helmBinary(t)
	m := render(t, bin)
	components := append(slices.Clone(serviceNames), "operator")

	// The bootstrap: a self-signed Issuer signs the CA, whose Issuer signs
	// the components.
	var selfSigned, ca issuer
	m.must(t, "Issuer", release+"-selfsigned", &selfSigned)
	m.must(t, "Issuer", release+"-ca", &ca)
	var caCert certificate
	m.must(t, "Certificate", release+"-ca", &caCert)
	if selfSigned.Spec.SelfSigned == nil || !caCert.Spec.IsCA || caCert.Spec.IssuerRef.Name != release+"-selfsigned" ||
		ca.Spec.CA == nil || ca.Spec.CA.SecretName != caCert.Spec.SecretName {
		t.Errorf("CA bootstrap: self-signed %+v, CA certificate %+v, CA issuer %+v", selfSigned.Spec, caCert.Spec, ca.Spec)
	}
	if n := len(m["Certificate"]); n != len(components)+1 {
		t.Errorf("%d Certificates %v; want one per component and the CA", n, m.names("Certificate"))
	}

	for _, name := range components {
		var c certificate
		m.must(t, "Certificate", release+"-"+name, &c)
		s := c.Spec
		if want := []string{"spiffe://v0m3/service/" + name}; !slices.Equal(s.URIs, want) {
			t.Errorf("%s: URIs %v; want %v", name, s.URIs, want)
		}
		if s.PrivateKey.Algorithm != "ECDSA" || s.PrivateKey.Size != 256 || s.PrivateKey.RotationPolicy != "Always" {
			t.Errorf("%s: private key %+v; want a new ECDSA P-256 key at each renewal", name, s.PrivateKey)
		}
		if s.IssuerRef.Name != release+"-ca" || s.IssuerRef.Kind != "Issuer" || s.IssuerRef.Group != "cert-manager.io" {
			t.Errorf("%s: issuer %+v; want the release's CA Issuer", name, s.IssuerRef)
		}
		if s.IsCA {
			t.Errorf("%s: certificate is a CA", name)
		}
		// Its Secret is the one the Deployment mounts.
		checkTLS(t, m, deployment(t, m, name), name, s.SecretName)
		if name == "operator" {
			if len(s.DNSNames) != 0 || !slices.Equal(s.Usages, []string{"digital signature", "client auth"}) {
				t.Errorf("operator: dnsNames %v usages %v; want a client certificate only", s.DNSNames, s.Usages)
			}
			continue
		}
		svc := release + "-" + name
		want := []string{svc, svc + "." + namespace, svc + "." + namespace + ".svc", svc + "." + namespace + ".svc.cluster.local"}
		if !slices.Equal(s.DNSNames, want) {
			t.Errorf("%s: dnsNames %v; want %v", name, s.DNSNames, want)
		}
		checkServiceAddr(t, m, name, fmt.Sprintf("%s:%d", s.DNSNames[0], ports[name]))
		if !slices.Equal(s.Usages, []string{"digital signature", "server auth", "client auth"}) {
			t.Errorf("%s: usages %v; want server and client auth (mutual TLS)", name, s.Usages)
		}
	}

	// Your own issuer: no bootstrap.
	m = render(t, bin, "tls.certManager.selfSignedCA=false", "tls.certManager.issuerRef.name=corp", "tls.certManager.issuerRef.kind=ClusterIssuer", "clusterDomain=k8s.example")
	if len(m["Issuer"]) != 0 {
		t.Errorf("issuerRef renders Issuers %v", m.names("Issuer"))
	}
	for _, name := range components {
		var c certificate
		m.must(t, "Certificate", release+"-"+name, &c)
		if c.Spec.IssuerRef.Name != "corp" || c.Spec.IssuerRef.Kind != "ClusterIssuer" {
			t.Errorf("%s: issuer %+v; want ClusterIssuer corp", name, c.Spec.IssuerRef)
		}
		if name != "operator" && !slices.Contains(c.Spec.DNSNames, release+"-"+name+"."+namespace+".svc.k8s.example") {
			t.Errorf("%s: dnsNames %v ignore clusterDomain", name, c.Spec.DNSNames)
		}
	}
	if out := helmFails(t, bin, "tls.certManager.selfSignedCA=false"); !strings.Contains(out, "issuerRef.name") {
		t.Errorf("no issuer: error %q; want one naming issuerRef.name", out)
	}

	// Your own Secrets: that component gets no Certificate and mounts yours.
	m = render(t, bin, "tls.existingSecrets.registry=reg-tls")
	if m.get(t, "Certificate", release+"-registry", &certificate{}) {
		t.Error("tls.existingSecrets.registry still renders a Certificate for the registry")
	}
	checkTLS(t, m, deployment(t, m, "registry"), "registry", "reg-tls")
	checkTLS(t, m, deployment(t, m, "policy"), "policy", release+"-policy-tls")

	// Without cert-manager every component needs a Secret.
	out := helmFails(t, bin, "tls.certManager.enabled=false", "tls.existingSecrets.registry=reg-tls")
	if !strings.Contains(out, "tls.existingSecrets.") {
		t.Errorf("cert-manager off, Secrets missing: error %q; want one naming tls.existingSecrets", out)
	}
	set := []string{"tls.certManager.enabled=false"}
	for _, name := range components {
		set = append(set, "tls.existingSecrets."+name+"="+name+"-own")
	}
	m = render(t, bin, set...)
	if len(m["Certificate"])+len(m["Issuer"]) != 0 {
		t.Errorf("cert-manager off renders %v %v", m.names("Certificate"), m.names("Issuer"))
	}
	for _, name := range components {
		checkTLS(t, m, deployment(t, m, name), name, name+"-own")
	}
}

// checkTLS checks that a v0m3 container reads its certificate, key and CA
// from files of the Secret secret, mounted read-only without subPath (so
// renewals reach the pod), and is not in plaintext mode.
func checkTLS(t *testing.T, m manifests, d *appsv1.Deployment, name, secret string) {
	t.Helper()
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	if _, ok := envValue(c, "V0M3_INSECURE_PLAINTEXT"); ok || slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--insecure-plaintext") }) {
		t.Errorf("%s: plaintext without being asked", name)
	}
	for env, key := range map[string]string{"V0M3_TLS_CA_FILE": "ca.crt", "V0M3_TLS_CERT_FILE": "tls.crt", "V0M3_TLS_KEY_FILE": "tls.key"} {
		file, ok := envValue(c, env)
		if !ok {
			t.Errorf("%s: no %s", name, env)
			continue
		}
		var mount *corev1.VolumeMount
		for i, vm := range c.VolumeMounts {
			if strings.HasPrefix(file, vm.MountPath+"/") && (mount == nil || len(vm.MountPath) > len(mount.MountPath)) {
				mount = &c.VolumeMounts[i]
			}
		}
		if mount == nil {
			t.Errorf("%s: %s=%s lies on no volume", name, env, file)
			continue
		}
		if !mount.ReadOnly || mount.SubPath != "" || strings.TrimPrefix(file, mount.MountPath+"/") != key {
			t.Errorf("%s: %s=%s on mount %+v; want key %s of a read-only mount without subPath", name, env, file, mount, key)
		}
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == mount.Name })
		if i < 0 || spec.Volumes[i].Secret == nil || spec.Volumes[i].Secret.SecretName != secret {
			t.Errorf("%s: %s is not on Secret %s", name, env, secret)
		} else if mode := spec.Volumes[i].Secret.DefaultMode; mode == nil || *mode&0o007 != 0 {
			t.Errorf("%s: certificate Secret mode %v is readable by others", name, mode)
		}
	}
}

func TestPlaintextOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	bin := helmBinary(t)
	components := append(slices.Clone(serviceNames), "operator")
	// Default: TLS everywhere (checkCommon checks every Deployment too).
	m := render(t, bin, "store=redis")
	for _, name := range components {
		checkTLS(t, m, deployment(t, m, name), name, release+"-"+name+"-tls")
	}

	m = render(t, bin, "tls.insecurePlaintext=true")
	if len(m["Certificate"])+len(m["Issuer"]) != 0 {
		t.Errorf("plaintext renders %v %v", m.names("Certificate"), m.names("Issuer"))
	}
	for _, name := range components {
		c := deployment(t, m, name).Spec.Template.Spec.Containers[0]
		if v, ok := envValue(c, "V0M3_INSECURE_PLAINTEXT"); !ok || v != "true" {
			t.Errorf("%s: V0M3_INSECURE_PLAINTEXT=%q with tls.insecurePlaintext=true", name, v)
		}
		for _, e := range c.Env {
			if strings.HasPrefix(e.Name, "V0M3_TLS_") {
				t.Errorf("%s: plaintext with %s set", name, e.Name)
			}
		}
		if slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.Name == "tls" }) {
			t.Errorf("%s: plaintext mounts a certificate", name)
		}
	}
}

func TestCallerAuthentication(t *testing.T) {
	t.Parallel()
	bin := helmBinary(t)
	m := render(t, bin, "oidc.issuer=https://login.example.com/", "oidc.audience=v0m3", "oidc.jwksUrl=https://login.example.com/jwks.json")
	want := map[string]string{
		"V0M3_OIDC_ISSUER":   "https://login.example.com/",
		"V0M3_OIDC_AUDIENCE": "v0m3",
		"V0M3_OIDC_JWKS_URL": "https://login.example.com/jwks.json",
	}
	for _, name := range serviceNames {
		c := deployment(t, m, name).Spec.Template.Spec.Containers[0]
		for k, v := range want {
			if got, _ := envValue(c, k); got != v {
				t.Errorf("%s: %s=%q; want %q", name, k, got, v)
			}
		}
		if _, ok := envValue(c, "V0M3_TOKEN_REVIEW"); ok {
			t.Errorf("%s: TokenReview on by default", name)
		}
	}
	if n := len(m["ClusterRoleBinding"]); n != 1 {
		t.Errorf("ClusterRoleBindings %v; want only the operator's by default", m.names("ClusterRoleBinding"))
	}

	// TokenReview: the orchestrator and registry, and only they, mount an
	// API token and may create TokenReviews.
	m = render(t, bin, "tokenReview.enabled=true", "tokenReview.audience=v0m3")
	reviewers := []string{"orchestrator", "registry"}
	for _, name := range serviceNames {
		spec := deployment(t, m, name).Spec.Template.Spec
		on, _ := envValue(spec.Containers[0], "V0M3_TOKEN_REVIEW")
		aud, _ := envValue(spec.Containers[0], "V0M3_TOKEN_REVIEW_AUDIENCE")
		token := spec.AutomountServiceAccountToken != nil && *spec.AutomountServiceAccountToken
		if want := slices.Contains(reviewers, name); (on == "true") != want || token != want || (aud == "v0m3") != want {
			t.Errorf("%s: V0M3_TOKEN_REVIEW=%q audience %q, API token mounted %v; want TokenReview %v", name, on, aud, token, want)
		}
	}
	var bound []string
	for _, n := range m.names("ClusterRoleBinding") {
		var b rbacv1.ClusterRoleBinding
		m.must(t, "ClusterRoleBinding", n, &b)
		if b.RoleRef.Name != "system:auth-delegator" {
			continue
		}
		if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.APIGroup != rbacv1.GroupName {
			t.Errorf("%s: roleRef %+v", n, b.RoleRef)
		}
		for _, s := range b.Subjects {
			if s.Kind == rbacv1.ServiceAccountKind && s.Namespace == namespace {
				bound = append(bound, s.Name)
			} else {
				t.Errorf("%s binds %+v", n, s)
			}
		}
	}
	slices.Sort(bound)
	if want := []string{release + "-orchestrator", release + "-registry"}; !slices.Equal(bound, want) {
		t.Errorf("system:auth-delegator bound to %v; want %v", bound, want)
	}
}

// resolveEnv returns a container's environment as the kubelet builds it:
// Secret references resolved from the rendered Secrets, and $(VAR)
// references to variables defined earlier expanded.
func resolveEnv(t *testing.T, who string, c corev1.Container, m manifests) map[string]string {
	t.Helper()
	env := map[string]string{}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			var s corev1.Secret
			m.must(t, "Secret", e.ValueFrom.SecretKeyRef.Name, &s)
			v, ok := s.Data[e.ValueFrom.SecretKeyRef.Key]
			if !ok {
				t.Fatalf("%s: %s names key %s, which Secret %s lacks", who, e.Name, e.ValueFrom.SecretKeyRef.Key, s.Name)
			}
			env[e.Name] = string(v)
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = who + "-pod"
		case e.ValueFrom != nil:
			t.Fatalf("%s: %s from %+v", who, e.Name, e.ValueFrom)
		default:
			env[e.Name] = ref.ReplaceAllStringFunc(e.Value, func(r string) string {
				name := ref.FindStringSubmatch(r)[1]
				if v, ok := env[name]; ok {
					return v
				}
				t.Errorf("%s: %s refers to $(%s), not defined before it", who, e.Name, name)
				return r
			})
		}
	}
	return env
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// renderedRedisCommand is the Redis container's command and arguments with
// its data in dir, listening on a loopback port.
func renderedRedisCommand(t *testing.T, c corev1.Container, env map[string]string, dir string, port int) *exec.Cmd {
	t.Helper()
	testkit.NeedsExternal(t, "redis-server (make redis)")
	if _, err := exec.LookPath("redis-server"); err != nil {
		msg := "redis-server not found; run `make redis`"
		if os.Getenv("CI") == "" {
			t.Skip("SKIPPING THE RENDERED REDIS COMMAND: " + msg)
		}
		t.Fatal(msg)
	}
	args := slices.Clone(c.Args)
	i := slices.Index(args, "/data")
	if i < 1 || args[i-1] != "--dir" {
		t.Fatalf("redis args %v: no --dir /data", args)
	}
	args[i] = dir
	args = append(args, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "")
	argv := append(slices.Clone(c.Command), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return cmd
}

// startRenderedRedis starts the rendered Redis and returns its address
// once it answers.
func startRenderedRedis(t *testing.T, c corev1.Container, env map[string]string) string {
	t.Helper()
	port := freePort(t)
	cmd := renderedRedisCommand(t, c, env, t.TempDir(), port)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	listening := testkit.Within(20*time.Second, func() bool {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return true
		}
		select {
		case err := <-done:
			t.Fatalf("rendered redis exited: %v\n%s", err, out.String())
		default:
		}
		return false
	})
	if !listening {
		t.Fatalf("rendered redis does not listen on %s\n%s", addr, out.String())
	}
	return addr
}

// helmFails renders with --set values that must be refused and returns
// Helm's error output.
func helmFails(t *testing.T, bin string, set ...string) string {
	t.Helper()
	args := []string{"template", release, ".", "--namespace", namespace}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("helm template %v: succeeded or did not run (%v); want a refusal", set, err)
	}
	return string(out)
}
