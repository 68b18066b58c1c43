package chart_test

import (
	"encoding/json"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// TestObservability: every service serves metrics on their own port
// (Service and container port "metrics", --metrics-addr), Prometheus may
// reach only that port, OTLP settings appear only with an endpoint, and
// the ServiceMonitor and dashboard render only when enabled.
func TestObservability(t *testing.T) {
	t.Parallel()
	bin := helmBinary(t)
	m := render(t, bin)
	for _, name := range serviceNames {
		d := deployment(t, m, name)
		c := d.Spec.Template.Spec.Containers[0]
		if !slices.Contains(c.Args, "--metrics-addr=:9090") {
			t.Errorf("%s: args %v lack --metrics-addr=:9090", name, c.Args)
		}
		if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" && p.ContainerPort == 9090 }) {
			t.Errorf("%s: no container port metrics/9090", name)
		}
		for _, e := range c.Env {
			if e.Name == "OTEL_EXPORTER_OTLP_ENDPOINT" {
				t.Errorf("%s: OTLP endpoint set without tracing.otlpEndpoint", name)
			}
		}
		var svc corev1.Service
		m.must(t, "Service", release+"-"+name, &svc)
		if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "metrics" && p.Port == 9090 }) {
			t.Errorf("%s: Service has no metrics port", name)
		}
	}
	var np networkingv1.NetworkPolicy
	m.must(t, "NetworkPolicy", release+"-metrics", &np)
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port.IntValue() != 9090 {
		t.Errorf("the metrics NetworkPolicy admits %v; want the metrics port only", np.Spec.Ingress)
	}
	if len(m["ServiceMonitor"]) != 0 || m["ConfigMap"][release+"-dashboard"] != nil {
		t.Error("ServiceMonitor or dashboard rendered while disabled")
	}

	m = render(t, bin, "metrics.serviceMonitor.enabled=true", "metrics.dashboard.enabled=true", "tracing.otlpEndpoint=http://collector:4317")
	if m["ServiceMonitor"][release+"-metrics"] == nil {
		t.Errorf("no ServiceMonitor; have %v", m.names("ServiceMonitor"))
	}
	var cm corev1.ConfigMap
	m.must(t, "ConfigMap", release+"-dashboard", &cm)
	var dash struct {
		Panels []struct {
			Title string `json:"title"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(cm.Data["v0m3.json"]), &dash); err != nil || len(dash.Panels) == 0 {
		t.Errorf("the dashboard ConfigMap holds no dashboard with panels: %v", err)
	}
	for _, name := range serviceNames {
		c := deployment(t, m, name).Spec.Template.Spec.Containers[0]
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
			return e.Name == "OTEL_EXPORTER_OTLP_ENDPOINT" && e.Value == "http://collector:4317"
		}) {
			t.Errorf("%s: no OTEL_EXPORTER_OTLP_ENDPOINT", name)
		}
	}

	m = render(t, bin, "metrics.enabled=false", "metrics.serviceMonitor.enabled=true")
	if len(m["ServiceMonitor"]) != 0 {
		t.Error("a ServiceMonitor rendered with metrics off")
	}
	for _, name := range serviceNames {
		if c := deployment(t, m, name).Spec.Template.Spec.Containers[0]; slices.Contains(c.Args, "--metrics-addr=:9090") {
			t.Errorf("%s: --metrics-addr with metrics off", name)
		}
	}
}
