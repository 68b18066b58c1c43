package chart_test

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// TestTaskMCPEndpoint: with orchestrator.mcp.enabled the orchestrator
// serves task MCP endpoints on their own port, reachable through its
// Service and admitted by its NetworkPolicy from where product services
// run, and only there; disabled (the default) none of it is rendered.
func TestTaskMCPEndpoint(t *testing.T) {
	t.Parallel()
	bin := helmBinary(t)
	orch := release + "-orchestrator"

	off := render(t, bin)
	for _, a := range deployment(t, off, "orchestrator").Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--mcp-") {
			t.Errorf("MCP disabled renders %s", a)
		}
	}

	m := render(t, bin, "orchestrator.mcp.enabled=true", "orchestrator.mcp.allowedHosts={mcp.example.com}",
		"orchestrator.mcp.approvalURL=https://console.example/approvals/{request_id}")
	c := deployment(t, m, "orchestrator").Spec.Template.Spec.Containers[0]
	wantArgs := []string{
		"--mcp-addr=:7410",
		"--mcp-url=https://" + orch + "." + namespace + ".svc:7410",
		"--mcp-token-ttl=1h",
		"--approval-url=https://console.example/approvals/{request_id}",
	}
	for _, w := range wantArgs {
		if !slices.Contains(c.Args, w) {
			t.Errorf("orchestrator args %v lack %s", c.Args, w)
		}
	}
	var hosts string
	for _, a := range c.Args {
		if h, ok := strings.CutPrefix(a, "--mcp-allowed-hosts="); ok {
			hosts = h
		}
	}
	for _, h := range []string{orch, orch + "." + namespace + ".svc", "mcp.example.com"} {
		if !slices.Contains(strings.Split(hosts, ","), h) {
			t.Errorf("--mcp-allowed-hosts=%s lacks %s", hosts, h)
		}
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "mcp" && p.ContainerPort == 7410 }) {
		t.Errorf("container ports %v lack mcp 7410", c.Ports)
	}
	var svc corev1.Service
	m.must(t, "Service", orch, &svc)
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		return p.Name == "mcp" && p.Port == 7410 && p.TargetPort.String() == "mcp"
	}) {
		t.Errorf("Service ports %v lack mcp 7410", svc.Spec.Ports)
	}
	var np networkingv1.NetworkPolicy
	m.must(t, "NetworkPolicy", orch, &np)
	admitted := false
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port != nil && p.Port.IntValue() == 7410 {
				admitted = len(rule.From) > 0
			}
		}
	}
	if !admitted {
		t.Errorf("the orchestrator's NetworkPolicy admits nobody on the MCP port: %v", np.Spec.Ingress)
	}
	// The authorization server's namespace, when named, may fetch the
	// JWKS there, and on no other port.
	withAS := render(t, bin, "orchestrator.mcp.enabled=true", "networkPolicy.jwksFrom[0].namespaceSelector.matchLabels.v0m3\\.dev/access=oauth")
	var asNP networkingv1.NetworkPolicy
	withAS.must(t, "NetworkPolicy", orch, &asNP)
	var asPorts []int
	for _, rule := range asNP.Spec.Ingress {
		for _, from := range rule.From {
			if from.NamespaceSelector != nil && from.NamespaceSelector.MatchLabels["v0m3.dev/access"] == "oauth" {
				for _, p := range rule.Ports {
					asPorts = append(asPorts, p.Port.IntValue())
				}
			}
		}
	}
	if !slices.Equal(asPorts, []int{7410}) {
		t.Errorf("the authorization server's namespace is admitted on ports %v, want the MCP port 7410 alone", asPorts)
	}
	// No other component's policy opens the MCP port.
	for _, name := range m.names("NetworkPolicy") {
		if name == orch {
			continue
		}
		var other networkingv1.NetworkPolicy
		m.must(t, "NetworkPolicy", name, &other)
		for _, rule := range other.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port != nil && p.Port.IntValue() == 7410 {
					t.Errorf("NetworkPolicy %s opens the MCP port", name)
				}
			}
		}
	}
}
