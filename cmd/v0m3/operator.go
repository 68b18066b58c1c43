package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/telemetry"
	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	"github.com/v0m3/v0m3/operator/controller"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// operatorScheme knows the built-in types, MCPServer, Capability and
// TaskProfile.
func operatorScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// runOperator runs the MCPServer, Capability and TaskProfile controllers
// against the cluster in the kubeconfig (or the pod's service account),
// registering servers and declaring definitions with the registry at
// --registry.
func runOperator(ctx context.Context, args []string, stderr io.Writer) error {
	fs := newFlags("operator", stderr)
	registryAddr := fs.String("registry", "v0m3-registry:7401", "registry gRPC address")
	bridgeImage := fs.String("bridge-image", "", "image holding the v0m3 binary for stdio servers' init container (pin by digest)")
	adapterNS := fs.String("adapter-namespace", "v0m3-system", "namespace of the V0M3 adapter, the only allowed client of MCP servers")
	adapterLabels := fs.String("adapter-labels", "app.kubernetes.io/name=v0m3,app.kubernetes.io/component=adapter", "labels selecting the adapter's pods")
	clusterDomain := fs.String("cluster-domain", "cluster.local", "cluster DNS domain")
	rolloutTimeout := fs.Duration("rollout-timeout", controller.DefaultRolloutTimeout, "how long a credential rotation's pods may take to become available before the rotation fails and the previous config revision keeps serving")
	metricsAddr := fs.String("metrics-addr", "0", "metrics listen address; 0 disables")
	healthAddr := fs.String("health-addr", ":8081", "health probe listen address")
	leaderElect := fs.Bool("leader-elect", false, "elect a leader so replicas do not reconcile at once")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	idf := addIdentityFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	creds, err := idf.credentials()
	if err != nil {
		return err
	}
	if creds != nil && creds.Service() != identity.Operator {
		return usageError{fmt.Sprintf("the certificate in --tls-cert-file names the %s service, not operator", creds.Service())}
	}
	log, err := newLogger(stderr, *level)
	if err != nil {
		return err
	}
	ctrl.SetLogger(logr.FromSlogHandler(log.Handler()))
	labels, err := parseLabels(*adapterLabels)
	if err != nil {
		return err
	}
	scheme, err := operatorScheme()
	if err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes config: %w", err)
	}
	for _, c := range telemetry.Collectors() {
		_ = ctrlmetrics.Registry.Register(c) // already registered by an earlier run in this process: kept
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress: *healthAddr,
		LeaderElection:         *leaderElect,
		LeaderElectionID:       "v0m3-operator.v0m3.dev",
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	// The operator calls the registry as the operator peer: mutual TLS with
	// its own certificate (plaintext only with --insecure-plaintext).
	// Its spans join the registry's (OTLP export only when configured).
	shutdown, err := telemetry.Setup(ctx, identity.Operator)
	if err != nil {
		return err
	}
	defer func() { _ = shutdown(context.WithoutCancel(ctx)) }()
	conn, err := grpc.NewClient(*registryAddr, append(identity.PeerDialOptions(identity.Operator, creds, identity.Registry),
		telemetry.ClientDialOptions(identity.Operator)...)...)
	if err != nil {
		return fmt.Errorf("registry %s: %w", *registryAddr, err)
	}
	defer conn.Close()
	r := &controller.Reconciler{
		Client:   mgr.GetClient(),
		Scheme:   scheme,
		Registry: registryv1.NewRegistryServiceClient(conn),
		Events:   mgr.GetEventRecorder("v0m3-operator"),
		Options: controller.Options{
			BridgeImage:      *bridgeImage,
			AdapterNamespace: *adapterNS,
			AdapterLabels:    labels,
			ClusterDomain:    *clusterDomain,
			RolloutTimeout:   *rolloutTimeout,
		},
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	// Capability and TaskProfile resources are declared in the registry
	// with the same operator identity.
	defs := registryv1.NewRegistryServiceClient(conn)
	if err := (&controller.CapabilityReconciler{
		Client: mgr.GetClient(), Registry: defs, Events: mgr.GetEventRecorder("v0m3-operator"),
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&controller.TaskProfileReconciler{
		Client: mgr.GetClient(), Registry: defs, Events: mgr.GetEventRecorder("v0m3-operator"),
	}).SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	log.Info("operator starting", "registry", *registryAddr)
	return mgr.Start(ctx)
}

// parseLabels parses "k=v,k2=v2".
func parseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usageError{fmt.Sprintf("label %q: want key=value", kv)}
		}
		out[k] = v
	}
	return out, nil
}
