package controller_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// One real kube-apiserver + etcd (envtest) and one real registry (over
// gRPC with mutual TLS, deciding reviews with the real policy service)
// serve every test; each test works in a namespace of its own.
var (
	cfg    *rest.Config
	k8s    client.Client
	scheme = runtime.NewScheme()
	// registry reaches the registry as the operator service, with its
	// certificate: what the reconciler uses.
	registry registryv1.RegistryServiceClient
	// services is the running registry and policy, for acting as a person.
	services *suite.Suite
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

// envtestPart names what the cluster tests need, for -short's skip line.
const envtestPart = "kube-apiserver and etcd (make envtest)"

func run(m *testing.M) int {
	flag.Parse()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	// Under -short (make unit) nothing external starts: the tests that
	// need the API server skip (needCluster), the others run.
	if testing.Short() {
		return m.Run()
	}
	assets, err := envtestAssets()
	if err != nil {
		fmt.Fprintln(os.Stderr, "envtest binaries:", err)
		return 1
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "charts", "v0m3", "crds")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err = env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start envtest:", err)
		return 1
	}
	defer env.Stop() //nolint:errcheck // best effort at exit

	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		return 1
	}

	dir, err := os.MkdirTemp("", "v0m3-operator-registry-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// The registry asks the policy service about people's actions; the
	// operator is a peer the access table admits by its certificate.
	services, err = suite.Start(context.Background(), suite.Config{DataDir: dir, Services: []string{suite.Registry, suite.Policy}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start registry:", err)
		return 1
	}
	defer services.Close()
	operator, err := services.PeerClients(identity.Operator)
	if err != nil {
		fmt.Fprintln(os.Stderr, "operator clients:", err)
		return 1
	}
	registry = operator.Registry
	return m.Run()
}

// envtestAssets returns the directory holding kube-apiserver and etcd:
// KUBEBUILDER_ASSETS when set (make test sets it), else what
// scripts/envtest.sh builds or finds in its cache.
func envtestAssets() (string, error) {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d, nil
	}
	cmd := exec.Command("bash", filepath.Join("..", "..", "scripts", "envtest.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("scripts/envtest.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// needCluster skips t under -short, where TestMain started no API server
// and no registry.
func needCluster(t *testing.T) {
	t.Helper()
	testkit.NeedsExternal(t, envtestPart)
}

// namespace creates a namespace of the test's own.
func namespace(t *testing.T) string {
	t.Helper()
	needCluster(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-"}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return ns.Name
}

// recorder keeps the events the reconciler emits.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) Eventf(_ runtime.Object, _ runtime.Object, typ, reason, _ string, note string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, typ+" "+reason+" "+fmt.Sprintf(note, args...))
}

func (r *recorder) has(reason string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if strings.Contains(e, " "+reason+" ") {
			return true
		}
	}
	return false
}

func typeName(v any) string { return fmt.Sprintf("%T", v) }
