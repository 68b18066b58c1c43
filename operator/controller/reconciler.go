package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Finalizer retires the registry connection before an MCPServer goes away.
const Finalizer = "v0m3.dev/retire-connection"

// FieldOwner is the server-side apply field manager of the operator.
const FieldOwner = client.FieldOwner("v0m3-operator")

// secretIndex indexes MCPServers by the name of the Secret they reference.
const secretIndex = ".spec.credentials.secretRef.name"

// resyncPeriod is how often a settled MCPServer is looked at again, to pick
// up registry-side changes (discovery, reviews) that Kubernetes cannot
// signal.
const resyncPeriod = 2 * time.Minute

// reviewPollPeriod is how often an MCPServer whose registry connection
// waits for review is looked at again, so its Deployment starts soon after
// a reviewer approves it.
const reviewPollPeriod = 15 * time.Second

// Options configures the reconciler.
type Options struct {
	// BridgeImage holds the v0m3 binary; stdio servers' init container
	// copies it into the pod. Pin it by digest in production.
	BridgeImage string
	// AdapterNamespace is where the V0M3 adapter runs; only its pods may
	// reach MCP servers.
	AdapterNamespace string
	// AdapterLabels select the adapter's pods in AdapterNamespace.
	AdapterLabels map[string]string
	// ClusterDomain is the cluster's DNS domain, for the registered
	// endpoint URL.
	ClusterDomain string
	// Endpoint, when set, is the URL registered for a server instead of
	// its Service's cluster DNS name: for an adapter that reaches servers
	// through something else (a gateway, or a test's local server).
	Endpoint func(*v1alpha1.MCPServer) string
	// RolloutTimeout bounds how long a credential rotation's pods may take
	// to become available before the rotation is reported failed (the
	// previous revision keeps serving). Zero means DefaultRolloutTimeout.
	RolloutTimeout time.Duration
}

// DefaultRolloutTimeout is the Deployment controller's default progress
// deadline: a rotation's pods not ready by then are not coming.
const DefaultRolloutTimeout = 10 * time.Minute

// withDefaults fills unset options.
func (o Options) withDefaults() Options {
	if o.BridgeImage == "" {
		o.BridgeImage = "ghcr.io/v0m3/v0m3:latest"
	}
	if o.AdapterNamespace == "" {
		o.AdapterNamespace = "v0m3-system"
	}
	if len(o.AdapterLabels) == 0 {
		o.AdapterLabels = map[string]string{"app.kubernetes.io/name": "v0m3", "app.kubernetes.io/component": "adapter"}
	}
	if o.ClusterDomain == "" {
		o.ClusterDomain = "cluster.local"
	}
	if o.RolloutTimeout <= 0 {
		o.RolloutTimeout = DefaultRolloutTimeout
	}
	return o
}

// Reconciler reconciles MCPServers. Registry is the registry's gRPC client
// (an interface, so a unit test may pass an in-process fake; the
// integration tests use a real registry over gRPC).
type Reconciler struct {
	Client   client.Client
	Scheme   *runtime.Scheme
	Registry registryv1.RegistryServiceClient
	Events   events.EventRecorder
	Options  Options
	// Now returns the current time; nil uses time.Now.
	Now func() time.Time
}

// +kubebuilder:rbac:groups=v0m3.dev,resources=mcpservers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=v0m3.dev,resources=mcpservers/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=v0m3.dev,resources=mcpservers/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=serviceaccounts;services,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the reconciler: it owns the four workload
// objects and watches Secrets (metadata only: the operator never reads a
// Secret's data) through a field index on the MCPServers that reference them.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	r.Options = r.Options.withDefaults()
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.MCPServer{}, secretIndex, func(o client.Object) []string {
		if c := o.(*v1alpha1.MCPServer).Spec.Credentials; c != nil {
			return []string{c.SecretRef.Name}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index MCPServers by Secret: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.MCPServer{}, connectionIndex, func(o client.Object) []string {
		if id := o.(*v1alpha1.MCPServer).Status.ConnectionID; id != "" {
			return []string{id}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index MCPServers by connection: %w", err)
	}
	watch := &registryWatch{client: mgr.GetClient(), registry: r.Registry, events: make(chan event.TypedGenericEvent[*v1alpha1.MCPServer])}
	if err := mgr.Add(watch); err != nil {
		return fmt.Errorf("watch registry events: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.MCPServer{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&corev1.Service{}).
		Owns(&appsv1.Deployment{}).
		Owns(&networkingv1.NetworkPolicy{}).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.serversUsingSecret), builder.OnlyMetadata).
		WatchesRawSource(source.Channel(watch.events, &handler.TypedEnqueueRequestForObject[*v1alpha1.MCPServer]{})).
		Complete(r)
}

// serversUsingSecret maps a Secret to the MCPServers that reference it.
func (r *Reconciler) serversUsingSecret(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.MCPServerList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{secretIndex: o.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "list MCPServers referencing Secret", "secret", o.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, s := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: s.Name}})
	}
	return reqs
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Reconcile brings one MCPServer's workload and registry connection in line
// with its spec and the version of its Secret, then records what it saw.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	r.Options = r.Options.withDefaults()
	var s v1alpha1.MCPServer
	if err := r.Client.Get(ctx, req.NamespacedName, &s); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !s.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, r.finalize(ctx, &s)
	}
	if controllerutil.AddFinalizer(&s, Finalizer) {
		if err := r.Client.Update(ctx, &s); err != nil {
			return reconcile.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}

	before := s.Status.DeepCopy()
	result, err := r.reconcile(ctx, &s)
	s.Status.ObservedGeneration = s.Generation
	if !equality.Semantic.DeepEqual(before, &s.Status) {
		if uerr := r.Client.Status().Update(ctx, &s); uerr != nil {
			return reconcile.Result{}, errors.Join(err, fmt.Errorf("update status: %w", uerr))
		}
	}
	return result, err
}

// reconcile runs the steps in order. A step that cannot proceed records why
// in a condition; an error is returned only when a retry may help.
func (r *Reconciler) reconcile(ctx context.Context, s *v1alpha1.MCPServer) (reconcile.Result, error) {
	credVersion, ok, err := r.observeCredentials(ctx, s)
	if err != nil || !ok {
		// Without its Secret the pod cannot start and no config revision can
		// name a credential version: wait for the Secret's watch event.
		return reconcile.Result{}, err
	}
	shape, err := shapeDigest(s, r.Options.BridgeImage)
	if err != nil {
		return reconcile.Result{}, err
	}
	hash, err := configHash(shape, credVersion)
	if err != nil {
		return reconcile.Result{}, err
	}

	for _, apply := range []func(context.Context, *v1alpha1.MCPServer) error{
		r.applyServiceAccount, r.applyService, r.applyNetworkPolicy,
	} {
		if err := apply(ctx, s); err != nil {
			return reconcile.Result{}, err
		}
	}

	// The registry learns the new revision before the pods roll, so the
	// adapter never talks to pods whose configuration it has not recorded.
	conn, err := r.register(ctx, s, shape, credVersion)
	if err != nil || conn == nil {
		return reconcile.Result{}, err
	}
	// Nothing of a configuration a reviewer has not approved runs: the
	// Deployment is applied only for an approved connection. The registry
	// cannot signal the operator, so a pending one is looked at again soon.
	if !r.reviewed(s, conn) {
		r.observeRegistry(ctx, s, conn)
		return reconcile.Result{RequeueAfter: reviewPollPeriod}, nil
	}
	s.Status.ConfigHash = hash

	dep, err := r.applyDeployment(ctx, s, hash, conn.GetConfigRevision())
	if err != nil {
		return reconcile.Result{}, err
	}
	r.observeRollout(s, dep)
	conn, again, err := r.reportRollout(ctx, s, conn, dep)
	r.observeRegistry(ctx, s, conn)
	if err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: min(again, resyncPeriod)}, nil
}

// observeCredentials finds the referenced Secret's resourceVersion, reading
// only its metadata. ok is false when the Secret is missing.
func (r *Reconciler) observeCredentials(ctx context.Context, s *v1alpha1.MCPServer) (version string, ok bool, err error) {
	c := s.Spec.Credentials
	if c == nil {
		r.setCondition(s, v1alpha1.ConditionCredentialsReady, metav1.ConditionTrue, v1alpha1.ReasonNoCredentials, "the server uses no credential")
		return "", true, nil
	}
	meta := &metav1.PartialObjectMetadata{}
	meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	err = r.Client.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: c.SecretRef.Name}, meta)
	if apierrors.IsNotFound(err) {
		msg := fmt.Sprintf("Secret %q does not exist in namespace %s; create it (key %q) and the server starts", c.SecretRef.Name, s.Namespace, c.SecretRef.Key)
		r.setCondition(s, v1alpha1.ConditionCredentialsReady, metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound, msg)
		r.setCondition(s, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound, msg)
		r.event(s, corev1.EventTypeWarning, v1alpha1.ReasonSecretNotFound, "WaitForSecret", msg)
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("get Secret %s: %w", c.SecretRef.Name, err)
	}
	return credentialVersion(meta.Name, meta.ResourceVersion), true, nil
}

func (r *Reconciler) applyServiceAccount(ctx context.Context, s *v1alpha1.MCPServer) error {
	return r.apply(ctx, s, "ServiceAccount", serviceAccount(s))
}

func (r *Reconciler) applyService(ctx context.Context, s *v1alpha1.MCPServer) error {
	return r.apply(ctx, s, "Service", service(s))
}

func (r *Reconciler) applyNetworkPolicy(ctx context.Context, s *v1alpha1.MCPServer) error {
	return r.apply(ctx, s, "NetworkPolicy", networkPolicy(s, r.Options))
}

// applyDeployment applies the Deployment and returns it as stored.
func (r *Reconciler) applyDeployment(ctx context.Context, s *v1alpha1.MCPServer, hash string, revision int64) (*appsv1.Deployment, error) {
	if err := r.apply(ctx, s, "Deployment", deployment(s, r.Options, hash, revision)); err != nil {
		return nil, err
	}
	var d appsv1.Deployment
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: s.Name}, &d); err != nil {
		return nil, fmt.Errorf("read Deployment back: %w", err)
	}
	return &d, nil
}

// apply server-side applies one owned object. A no-op apply leaves the
// object's resourceVersion unchanged, which keeps reconciles idempotent.
func (r *Reconciler) apply(ctx context.Context, s *v1alpha1.MCPServer, kind string, obj runtime.ApplyConfiguration) error {
	if err := r.Client.Apply(ctx, obj, FieldOwner, client.ForceOwnership); err != nil {
		r.event(s, corev1.EventTypeWarning, "ApplyFailed", "Apply"+kind, fmt.Sprintf("could not apply %s %s: %v", kind, s.Name, err))
		return fmt.Errorf("apply %s: %w", kind, err)
	}
	return nil
}

// observeRollout sets Ready and the rotation's progress from the
// Deployment's status. Without a kube-controller-manager and kubelets (as
// in envtest) that status never changes, so the rotation stays in progress.
func (r *Reconciler) observeRollout(s *v1alpha1.MCPServer, d *appsv1.Deployment) {
	done, why := rolledOutAt(d, s.Status.ConfigRevision)
	s.Status.DesiredReplicas = desiredReplicas(d)
	s.Status.UpdatedReadyReplicas = min(d.Status.UpdatedReplicas, d.Status.AvailableReplicas)
	if rot := s.Status.Rotation; rot != nil && rot.CompletionTime == nil {
		if done {
			t := metav1.NewTime(r.now())
			rot.CompletionTime = &t
			rot.Failure = ""
			r.event(s, corev1.EventTypeNormal, "RotationComplete", "Rotate",
				fmt.Sprintf("pods for config revision %d (credential %s) are available", rot.ToRevision, rot.CredentialVersion))
		} else if rot.Failure == "" {
			r.setCondition(s, v1alpha1.ConditionCredentialsReady, metav1.ConditionFalse, v1alpha1.ReasonRotationInProgress,
				fmt.Sprintf("rotating from config revision %d to %d (credential %s): %s", rot.FromRevision, rot.ToRevision, rot.CredentialVersion, why))
		}
	}
	if s.Spec.Credentials != nil && (s.Status.Rotation == nil || s.Status.Rotation.CompletionTime != nil) {
		r.setCondition(s, v1alpha1.ConditionCredentialsReady, metav1.ConditionTrue, v1alpha1.ReasonCredentialsCurrent,
			fmt.Sprintf("pods use credential %s", s.Status.CredentialVersion))
	}
	if done {
		r.setCondition(s, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonAvailable,
			fmt.Sprintf("serving config revision %d at %s", s.Status.ConfigRevision, s.Status.Endpoint))
	} else {
		r.setCondition(s, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonProgressing, why)
	}
}

// rolledOut says whether the Deployment's current pod template is fully
// rolled out and available, and if not, what it waits for.
func rolledOut(d *appsv1.Deployment) (bool, string) {
	want := desiredReplicas(d)
	st := d.Status
	switch {
	case st.ObservedGeneration < d.Generation:
		return false, "waiting for the Deployment controller to observe the new pod template"
	case st.UpdatedReplicas < want:
		return false, fmt.Sprintf("%d of %d pods run the new pod template", st.UpdatedReplicas, want)
	case st.Replicas > st.UpdatedReplicas:
		return false, fmt.Sprintf("%d old pods are still terminating", st.Replicas-st.UpdatedReplicas)
	case st.AvailableReplicas < want:
		return false, fmt.Sprintf("%d of %d new pods are available", st.AvailableReplicas, want)
	}
	return true, ""
}

// rolledOutAt is rolledOut for the pod template of config revision rev: a
// Deployment read from a cache that has not seen the template just applied
// is not that revision's rollout, however complete.
func rolledOutAt(d *appsv1.Deployment, rev int64) (bool, string) {
	if d.Spec.Template.Annotations[AnnotationConfigRevision] != itoa64(rev) {
		return false, fmt.Sprintf("the pod template is not at config revision %d yet", rev)
	}
	return rolledOut(d)
}

// desiredReplicas is how many pods d wants.
func desiredReplicas(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas != nil {
		return *d.Spec.Replicas
	}
	return 1
}

func (r *Reconciler) setCondition(s *v1alpha1.MCPServer, typ string, status metav1.ConditionStatus, reason, msg string) {
	setCondition(&s.Status.Conditions, s.Generation, typ, status, reason, msg, r.now())
}

// event records a Kubernetes event on s; a nil recorder drops it.
func (r *Reconciler) event(s *v1alpha1.MCPServer, typ, reason, action, note string) {
	if r.Events != nil {
		r.Events.Eventf(s, nil, typ, reason, action, "%s", note)
	}
}

// finalize retires the registry connection, keeping its history readable,
// then lets the MCPServer go. Owned objects follow through garbage
// collection.
func (r *Reconciler) finalize(ctx context.Context, s *v1alpha1.MCPServer) error {
	if !controllerutil.ContainsFinalizer(s, Finalizer) {
		return nil
	}
	if err := r.retire(ctx, s); err != nil {
		return err
	}
	patch := client.MergeFrom(s.DeepCopy())
	controllerutil.RemoveFinalizer(s, Finalizer)
	if err := r.Client.Patch(ctx, s, patch); err != nil {
		return fmt.Errorf("remove finalizer: %w", client.IgnoreNotFound(err))
	}
	return nil
}
