package realnode_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	"github.com/v0m3/v0m3/operator/controller"
	"github.com/v0m3/v0m3/suite"
)

// The node and everything on it, brought up once by the first test that
// needs it (the static-binary test does not) and torn down by TestMain.
var (
	nodeOnce sync.Once
	// nodeErr says why there is no node.
	nodeErr error
	nodeEnv map[string]string

	scheme = runtime.NewScheme()
	cfg    *rest.Config
	k8s    client.Client
	// services run in this process: the operator reaches the registry as
	// a peer, people act through services.Clients.
	services *suite.Suite
	// bridgeImage holds the static v0m3 binary at ko's path; the operator's
	// init container copies it into stdio servers' pods.
	bridgeImage string
	// fixtureImage holds nothing but the same binary, at another path: an
	// "arbitrary" server image with no bridge, shell or libc of its own.
	fixtureImage string
	// probeImage holds tools/realnode/probe: one TCP dial from inside a pod.
	probeImage string
	// fixturePath is where fixtureImage holds the binary.
	fixturePath = "/usr/local/bin/fixture"
	// teardown runs, in reverse, what bringing the node up started.
	teardown []func()
)

func TestMain(m *testing.M) {
	flag.Parse()
	// The operator's errors, for a failing run; its info logs are noise.
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	code := m.Run()
	for i := len(teardown) - 1; i >= 0; i-- {
		teardown[i]()
	}
	os.Exit(code)
}

// hostChanges names what bringing the node up changes on this host, for
// the opt-in message (scripts/realnode.sh down undoes all of it).
const hostChanges = "iptables rules and ipsets, a bridge and veths, sysctls, cgroups, a block of /etc/hosts, daemons run as root"

// needNode brings the node up on first use. Under -short it skips (the
// node is an external part); outside CI it runs only when the person opted
// in to tests that change the host (V0M3_HOST_TESTS=1). Where it cannot
// run (not root, packages missing: make realnode installs them), the test
// is skipped with a loud message, except under CI, where it fails: a CI
// that cannot run the real-node tests must not look green.
func needNode(t *testing.T) {
	t.Helper()
	testkit.NeedsExternal(t, "a real single-node cluster (root; make realnode)")
	testkit.ChangesHost(t, hostChanges)
	nodeOnce.Do(func() {
		nodeErr = startNode()
		if nodeErr != nil {
			loud("the real-node tests cannot run here: "+nodeErr.Error(),
				"they prove MCPServers become running, sandboxed pods; run them as root on Linux",
				"after V0M3_HOST_TESTS=1 make realnode (it installs what they need) or see scripts/realnode.sh check")
		}
	})
	if nodeErr != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and the real node cannot run: %v", nodeErr)
		}
		t.Skipf("SKIPPED: no real node here: %v", nodeErr)
	}
}

func loud(lines ...string) {
	fmt.Fprintln(os.Stderr, strings.Repeat("#", 72))
	for _, l := range lines {
		fmt.Fprintln(os.Stderr, "### "+l)
	}
	fmt.Fprintln(os.Stderr, strings.Repeat("#", 72))
}

// script runs scripts/realnode.sh with args; its stderr (progress) goes to
// the test's stderr, its stdout is returned.
func script(args ...string) (string, error) {
	cmd := exec.Command("bash", append([]string{filepath.Join(repoRoot, "scripts", "realnode.sh")}, args...)...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

func startNode() error {
	if why, err := script("check"); err != nil {
		return fmt.Errorf("%s", strings.ReplaceAll(why, "\n", "; "))
	}
	start := time.Now()
	out, err := script("up")
	if err != nil {
		return fmt.Errorf("scripts/realnode.sh up: %w", err)
	}
	teardown = append(teardown, func() {
		if _, err := script("down"); err != nil {
			loud("scripts/realnode.sh down failed: host changes may remain; run it again")
		}
	})
	nodeEnv = map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			nodeEnv[k] = v
		}
	}
	fmt.Fprintf(os.Stderr, "realnode: node up in %s\n", time.Since(start).Round(time.Second))

	if err := images(); err != nil {
		return err
	}
	cfg, err = clientcmd.BuildConfigFromFlags("", nodeEnv["KUBECONFIG"])
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join(repoRoot, "charts", "v0m3", "crds")}, ErrorIfPathMissing: true,
	}); err != nil {
		return fmt.Errorf("install CRDs: %w", err)
	}
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return err
	}

	dir, err := os.MkdirTemp("", "v0m3-realnode-services-")
	if err != nil {
		return err
	}
	teardown = append(teardown, func() { os.RemoveAll(dir) })
	// Pod addresses are private (the CNI bridge's 10.244.0.0/24): the
	// adapter may reach them, as it would reach in-cluster Services.
	services, err = suite.Start(context.Background(), suite.Config{
		DataDir: dir,
		Reach:   &suite.Reach{AllowPrivateNetworks: true},
	})
	if err != nil {
		return fmt.Errorf("start services: %w", err)
	}
	teardown = append(teardown, services.Close)

	if err := startOperator(); err != nil {
		return err
	}
	return startResolver()
}

// images builds the v0m3 binary the way the image build does (static) and
// pushes the bridge image and the fixture server image to the node's
// registry.
func images() error {
	dir, err := os.MkdirTemp("", "v0m3-realnode-bin-")
	if err != nil {
		return err
	}
	teardown = append(teardown, func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "v0m3")
	if b, err := exec.Command("make", "-C", repoRoot, "build", "BIN="+bin).CombinedOutput(); err != nil {
		return fmt.Errorf("make build: %w\n%s", err, b)
	}
	if bridgeImage, err = script("image", "v0m3", bin, "/ko-app/v0m3"); err != nil {
		return fmt.Errorf("push the bridge image: %w", err)
	}
	if fixtureImage, err = script("image", "fixture", bin, fixturePath); err != nil {
		return fmt.Errorf("push the fixture image: %w", err)
	}
	tools, err := script("build")
	if err != nil {
		return fmt.Errorf("scripts/realnode.sh build: %w", err)
	}
	if probeImage, err = script("image", "probe", filepath.Join(tools, "probe"), "/probe"); err != nil {
		return fmt.Errorf("push the probe image: %w", err)
	}
	return nil
}

// startOperator runs the operator's MCPServer reconciler under a manager
// against the node's API server, reaching the registry with the operator's
// own certificate.
func startOperator() error {
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	peers, err := services.PeerClients(identity.Operator)
	if err != nil {
		return err
	}
	r := &controller.Reconciler{
		Client:   mgr.GetClient(),
		Scheme:   scheme,
		Registry: peers.Registry,
		Events:   mgr.GetEventRecorder("v0m3-operator"),
		Options:  controller.Options{BridgeImage: bridgeImage},
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		cancel()
		return fmt.Errorf("operator setup: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	teardown = append(teardown, func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "operator manager:", err)
		}
	})
	return nil
}

// namespace creates a namespace of the test's own that enforces the
// restricted Pod Security Standard: the API server itself refuses any pod
// that is not restricted.
func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "rn-", Labels: map[string]string{
		"pod-security.kubernetes.io/enforce":         "restricted",
		"pod-security.kubernetes.io/enforce-version": "latest",
	}}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		// Deleting the namespace deletes its pods on the node: the node's
		// tear-down then finds nothing of this test running.
		if err := k8s.Delete(context.Background(), ns); err != nil {
			t.Errorf("delete namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

// waitFor polls cond until it holds or timeout passes. The timeout only
// bounds a broken run (a pod start includes an image pull on a loaded
// machine); nothing asserts how long it takes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %s waiting for %s; last seen: %s", timeout, what, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
