package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/v0m3/v0m3/internal/testkit"
)

// runRotationCLI runs `v0m3 rotation args...` as main does and returns its
// error text, which must exist: every case here has no cluster to ask.
func runRotationCLI(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(context.Background(), append([]string{"rotation"}, args...), &out, &errb)
	if err == nil {
		t.Fatalf("rotation %v succeeded without a cluster; stdout:\n%s", args, out.String())
	}
	if out.Len() != 0 {
		t.Errorf("rotation %v printed a table without a cluster:\n%s", args, out.String())
	}
	return err.Error()
}

// wantAll fails t for each of wants msg lacks, and for client-go's own
// advice, which names nothing a V0M3 user can act on.
func wantAll(t *testing.T, msg string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(msg, w) {
			t.Errorf("error lacks %q:\n%s", w, msg)
		}
	}
	if strings.Contains(msg, "KUBERNETES_MASTER") {
		t.Errorf("error repeats client-go's KUBERNETES_MASTER advice:\n%s", msg)
	}
}

// `v0m3 rotation` without a cluster says what it needs: where it looked
// for one (the kubeconfig and context), and what to do, instead of a Go
// error dump. Not parallel: it sets KUBECONFIG.
func TestRotationWithoutACluster(t *testing.T) {
	// Not in a pod: no in-cluster fallback.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	dir := t.TempDir()

	t.Run("no kubeconfig at all", func(t *testing.T) {
		if _, err := os.Stat(clientcmd.RecommendedHomeFile); err == nil {
			t.Skipf("this machine has %s; the case needs a home without one", clientcmd.RecommendedHomeFile)
		}
		t.Setenv("KUBECONFIG", "")
		msg := runRotationCLI(t)
		wantAll(t, msg, "no Kubernetes cluster", "--kubeconfig (not given)", "$KUBECONFIG (not set)",
			clientcmd.RecommendedHomeFile+" (no such file)", "KUBECONFIG=FILE", "--context NAME", "make run")
	})

	t.Run("KUBECONFIG names a missing file", func(t *testing.T) {
		missing := filepath.Join(dir, "missing.yaml")
		t.Setenv("KUBECONFIG", missing)
		msg := runRotationCLI(t)
		wantAll(t, msg, "no Kubernetes cluster", "$KUBECONFIG="+missing+" (no such file)", "--kubeconfig FILE")
	})

	t.Run("--kubeconfig names a missing file", func(t *testing.T) {
		missing := filepath.Join(dir, "gone.yaml")
		msg := runRotationCLI(t, "--kubeconfig", missing)
		wantAll(t, msg, "--kubeconfig", missing, "no such file")
	})

	// A kubeconfig whose API server is a loopback port nobody listens on.
	l := testkit.ListenLoopback(t)
	server := "https://" + l.Addr().String()
	l.Close()
	kubeconfig := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: gone
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: me
  user: {token: not-a-secret}
contexts:
- name: staging
  context: {cluster: gone, user: me}
- name: prod
  context: {cluster: gone, user: me}
current-context: staging
`, server), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("the API server is not there", func(t *testing.T) {
		msg := runRotationCLI(t, "--kubeconfig", kubeconfig)
		wantAll(t, msg, "cannot reach the API server "+server, `context "staging" in `+kubeconfig, "connection refused", "--context")
	})

	t.Run("--context names no context", func(t *testing.T) {
		msg := runRotationCLI(t, "--kubeconfig", kubeconfig, "--context", "qa")
		wantAll(t, msg, `no context "qa" in `+kubeconfig, "it has: prod, staging")
	})

	t.Run("--context picks another context", func(t *testing.T) {
		msg := runRotationCLI(t, "--kubeconfig", kubeconfig, "--context", "prod")
		wantAll(t, msg, `context "prod" in `+kubeconfig)
	})
}

// A real API server without the V0M3 CRDs: rotation says the chart is not
// installed there and how to install it, rather than "no matches for kind".
func TestRotationClusterWithoutV0M3(t *testing.T) {
	testkit.NeedsExternal(t, "kube-apiserver and etcd (make envtest)")
	assets, err := testkit.EnvtestAssets()
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	if _, err := env.Start(); err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	kubeconfig := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	msg := runRotationCLI(t, "--kubeconfig", kubeconfig)
	wantAll(t, msg, "has no MCPServer resource", kubeconfig, "V0M3 chart", "helm install")
}
