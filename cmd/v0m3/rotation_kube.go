package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// kubeFlags are how `v0m3 rotation` finds the cluster the operator runs
// in, the way kubectl does: --kubeconfig, else $KUBECONFIG, else
// ~/.kube/config, else the pod's service account; --context picks a
// context other than the current one.
type kubeFlags struct {
	kubeconfig, context *string
}

func addKubeFlags(fs *flag.FlagSet) *kubeFlags {
	return &kubeFlags{
		kubeconfig: fs.String("kubeconfig", "", "kubeconfig file of the cluster the V0M3 operator runs in (default: $KUBECONFIG, else ~/.kube/config, else the pod's service account)"),
		context:    fs.String("context", "", "kubeconfig context to use (default: the current context)"),
	}
}

// kubeTarget is the cluster a command talks to, described for messages:
// which context of which kubeconfig, at which API server.
type kubeTarget struct {
	cfg     *rest.Config
	context string // "" when in-cluster
	source  string // the kubeconfig file(s), or "in-cluster service account"
}

func (k kubeTarget) String() string {
	if k.context == "" {
		return fmt.Sprintf("the API server %s (%s)", k.cfg.Host, k.source)
	}
	return fmt.Sprintf("the API server %s (context %q in %s)", k.cfg.Host, k.context, k.source)
}

// requestTimeout bounds each call to the API server, so an address that
// drops packets fails with a message instead of hanging.
const requestTimeout = 30 * time.Second

// config resolves the cluster. Every failure says where it looked and what
// to do, rather than client-go's own wording ("try setting
// KUBERNETES_MASTER"), which names nothing a V0M3 user can act on.
func (f *kubeFlags) config() (kubeTarget, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *f.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: *f.context}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	raw, rawErr := cc.RawConfig()
	cfg, err := cc.ClientConfig()
	switch {
	case *f.kubeconfig != "" && rawErr != nil:
		return kubeTarget{}, fmt.Errorf("cannot read the kubeconfig given with --kubeconfig: %w\n%s", rawErr, kubeHelp)
	case err != nil && clientcmd.IsEmptyConfig(err):
		return kubeTarget{}, fmt.Errorf("no Kubernetes cluster to ask: MCPServers and their rotations live in the cluster the V0M3 operator runs in, and no cluster configuration was found.\n"+
			"  looked for: %s\n%s", strings.Join(f.lookedFor(rules), "; "), kubeHelp)
	case err != nil && *f.context != "" && raw.Contexts[*f.context] == nil:
		return kubeTarget{}, fmt.Errorf("no context %q in %s (it has: %s)\n%s", *f.context, kubeconfigFiles(rules), contextNames(raw.Contexts), kubeHelp)
	case err != nil:
		return kubeTarget{}, fmt.Errorf("the Kubernetes configuration in %s is not usable: %w\n%s", kubeconfigFiles(rules), err, kubeHelp)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = requestTimeout
	}
	t := kubeTarget{cfg: cfg, context: raw.CurrentContext, source: kubeconfigFiles(rules)}
	if *f.context != "" {
		t.context = *f.context
	}
	if len(raw.Contexts) == 0 {
		// An empty kubeconfig fell back to the pod's service account.
		t.context, t.source = "", "in-cluster service account"
	}
	return t, nil
}

// kubeHelp is what to do about any of config's failures.
const kubeHelp = "  to fix: point v0m3 at the cluster where the V0M3 chart (its operator and CRDs) is installed: --kubeconfig FILE and/or --context NAME, or KUBECONFIG=FILE (`kubectl config get-contexts` lists the contexts).\n" +
	"  A suite run on one machine (make run, v0m3 dev) has no operator and so no MCPServer rotations to show."

// lookedFor lists each place config looked, with what it found there.
func (f *kubeFlags) lookedFor(rules *clientcmd.ClientConfigLoadingRules) []string {
	var out []string
	if *f.kubeconfig == "" {
		out = append(out, "--kubeconfig (not given)")
	}
	if env := os.Getenv(clientcmd.RecommendedConfigPathEnvVar); env == "" {
		out = append(out, "$KUBECONFIG (not set)")
	} else {
		out = append(out, fmt.Sprintf("$KUBECONFIG=%s (%s)", env, filesState(filepath.SplitList(env))))
	}
	if home := clientcmd.RecommendedHomeFile; os.Getenv(clientcmd.RecommendedConfigPathEnvVar) == "" {
		out = append(out, fmt.Sprintf("%s (%s)", home, filesState([]string{home})))
	}
	if os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		out = append(out, "an in-cluster service account (not running in a pod)")
	}
	return out
}

// filesState says whether files exist: "no such file" when none does,
// "empty of clusters" when they exist but hold no usable context.
func filesState(files []string) string {
	for _, f := range files {
		if _, err := os.Stat(f); err == nil {
			return "found, but it names no cluster"
		}
	}
	if len(files) > 1 {
		return "none of these files exists"
	}
	return "no such file"
}

// kubeconfigFiles names the kubeconfig file(s) the rules read.
func kubeconfigFiles(rules *clientcmd.ClientConfigLoadingRules) string {
	if rules.ExplicitPath != "" {
		return rules.ExplicitPath
	}
	files := rules.GetLoadingPrecedence()
	if len(files) == 0 {
		return "no kubeconfig"
	}
	return strings.Join(files, ":")
}

func contextNames[V any](m map[string]V) string {
	if len(m) == 0 {
		return "no contexts"
	}
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// explainListError turns a failure to list MCPServers into what it means
// for the person: the cluster is unreachable, has no V0M3 CRDs, or refuses
// them, naming the target and what to do. Other errors are wrapped as is.
func explainListError(t kubeTarget, err error) error {
	var netErr net.Error
	var opErr *net.OpError
	switch {
	case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
		return fmt.Errorf("%s has no MCPServer resource: the V0M3 chart (its CRDs and operator) is not installed there.\n"+
			"  to fix: install it (helm install v0m3 charts/v0m3 -n v0m3-system --create-namespace), or choose the cluster where it is with --context or --kubeconfig", t)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s did not accept your credentials (401): %v\n  to fix: log in to the cluster again, or choose another context with --context", t, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s refused to list MCPServers (403): %v\n  to fix: ask for permission to list mcpservers.v0m3.dev, or use another context", t, err)
	case errors.As(err, &opErr):
		return fmt.Errorf("cannot reach %s: %v\n  to fix: check that the cluster is up and that this is the context you meant (choose another with --context or --kubeconfig)", t, opErr)
	case errors.As(err, &netErr):
		return fmt.Errorf("cannot reach %s: %v\n  to fix: check that the cluster is up and that this is the context you meant (choose another with --context or --kubeconfig)", t, err)
	}
	return fmt.Errorf("list MCPServers from %s: %w", t, err)
}
