// Package operator holds the Kubernetes operator that turns MCPServer custom
// resources (api/v1alpha1) into sandboxed workloads and V0M3 registry
// connections (controller/), declares Capability and TaskProfile resources
// in the registry, and the stdio bridge MCPServer workloads run (bridge/).
// `v0m3 operator` runs it; `v0m3 rotation` shows rotation state.
//
// # What an MCPServer becomes
//
// A ServiceAccount without a token, a Deployment under the restricted Pod
// Security Standard (read-only root filesystem, a size-limited /work
// emptyDir, all capabilities dropped, RuntimeDefault seccomp, non-root), a
// Service, and a NetworkPolicy that admits only the adapter's pods and lets
// out only the egress allow-list. All four are server-side applied with the
// MCPServer as controller owner, so a settled reconcile writes nothing.
//
// The registry connection's transport is the Service's streamable HTTP
// endpoint. Its config revision moves when the image digest, the
// credential's version (Secret name@resourceVersion, never its data: the
// operator watches Secrets as metadata only) or the workload's shape
// changes; the shape digest is the connection's workload_digest.
//
// # Which revision serves
//
// A new config revision is registered with keep_serving: calls execute at,
// and approvals bind to, the previous revision until the new pod template's
// pods are available (maxUnavailable 0, so the old pods run until then);
// then the operator reports the rollout (RegistryService/ReportRollout) and
// the registry switches. A replaced pod sleeps in preStop for drainDelay,
// keeping the adapter's open connections answered while the switch
// propagates. A rollout the Deployment controller gives up on
// (ProgressDeadlineExceeded), or a credential rotation whose pods are not
// available within Options.RolloutTimeout, is reported failed: the previous
// revision keeps serving, and the Serving and CredentialsReady conditions
// (RotationFailed), a Warning event, the registry's rollout_failure and the
// trace of each call made meanwhile say why.
//
// # What status can and cannot show
//
// Observed by the operator: the registry's latest and serving config
// revision (Serving), the rollout's progress (pods available/desired),
// the registry's config revision and digest,
// the credential version in force, the connection's review state and
// mappings needing review (ReviewRequired), the latest discovery snapshot
// and whether it was taken at the current revision (Discovered), and the
// Deployment's rollout status (Ready, and the end of a rotation:
// CredentialsReady stays False with reason RotationInProgress until the
// Deployment reports the new pod template's replicas updated and available).
//
// Not observed: whether the server inside the pod actually accepted the new
// credential (only that the pods started with it and passed the readiness
// probe: a server that checks its credential at start and exits when it is
// refused never becomes ready, which fails the rotation), and registry-side changes between resyncs (every two minutes).
// Under envtest there is no kube-controller-manager or kubelet, so
// Deployment status never changes by itself; the tests write it the way the
// Deployment controller would to prove the rotation's completion path.
//
// # What a Capability or TaskProfile becomes
//
// A registry definition of the same name with hyphens written as
// underscores (both kinds are cluster-scoped: registry names are global),
// managed_by kubernetes/<plural>.v0m3.dev/<name>. The operator creates it,
// or updates it with a compare-and-set on the revision it read; the
// registry makes an identical definition a no-op, so a settled resource
// writes nothing. The registry alone validates: a refusal is recorded in
// Accepted with the registry's reason and field violations as spec paths
// and is not retried until the spec changes. A name someone else manages is
// refused (NameClaimed) unless the resource carries v0m3.dev/adopt=true.
// Deleting the resource deprecates the definition it manages, never
// another's. Mappings are still reviewed by a person in the registry; the
// resource only shows how many wait.
package operator
