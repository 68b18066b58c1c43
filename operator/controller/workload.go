package controller

import (
	"maps"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsac "k8s.io/client-go/applyconfigurations/apps/v1"
	coreac "k8s.io/client-go/applyconfigurations/core/v1"
	metaac "k8s.io/client-go/applyconfigurations/meta/v1"
	netac "k8s.io/client-go/applyconfigurations/networking/v1"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
)

// Labels and annotations the operator sets.
const (
	// LabelServer names the MCPServer a pod belongs to; the Service, the
	// Deployment and the NetworkPolicy select on it.
	LabelServer = "v0m3.dev/mcpserver"
	// AnnotationConfigHash on the pod template carries the config hash, so a
	// change (including a Secret rotation) rolls the Deployment.
	AnnotationConfigHash = "v0m3.dev/config-hash"
	// AnnotationConfigRevision on the pod template records the registry
	// config revision the pods were started for, for people reading pods.
	AnnotationConfigRevision = "v0m3.dev/config-revision"
)

// Paths inside the pod.
const (
	workDir        = "/work"
	bridgeDir      = "/opt/v0m3/bin"
	bridgeBinary   = bridgeDir + "/v0m3"
	credentialsDir = "/var/run/secrets/v0m3/credentials"
)

// drainDelay is how long a replaced pod keeps serving its open
// connections (see deployment).
const drainDelay = 10 * time.Second

// The UID and GID pods run as: not root, and not a UID an image is likely
// to give a meaning (65532 is distroless' "nonroot").
const nonRootID = 65532

// defaultWorkDirLimit bounds /work when the spec leaves it out (the CRD
// defaults it too; this covers objects created before the default).
var defaultWorkDirLimit = resource.MustParse("64Mi")

// labels returns the labels of every object owned by s.
func labels(s *v1alpha1.MCPServer) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":       "mcp-server",
		"app.kubernetes.io/instance":   s.Name,
		"app.kubernetes.io/component":  "mcp-server",
		"app.kubernetes.io/managed-by": "v0m3-operator",
		LabelServer:                    s.Name,
	}
}

// selector returns the pod selector of s's workload. It never changes for a
// given MCPServer: Deployment selectors are immutable.
func selector(s *v1alpha1.MCPServer) map[string]string {
	return map[string]string{LabelServer: s.Name}
}

// owner returns the controller owner reference to s.
func owner(s *v1alpha1.MCPServer) *metaac.OwnerReferenceApplyConfiguration {
	return metaac.OwnerReference().
		WithAPIVersion(v1alpha1.GroupVersion.String()).
		WithKind("MCPServer").
		WithName(s.Name).
		WithUID(s.UID).
		WithController(true).
		WithBlockOwnerDeletion(true)
}

// serviceAccount is the pod's identity: no API token is mounted, since an
// MCP server has no business talking to the Kubernetes API.
func serviceAccount(s *v1alpha1.MCPServer) *coreac.ServiceAccountApplyConfiguration {
	return coreac.ServiceAccount(s.Name, s.Namespace).
		WithLabels(labels(s)).
		WithOwnerReferences(owner(s)).
		WithAutomountServiceAccountToken(false)
}

// service exposes the MCP endpoint inside the cluster.
func service(s *v1alpha1.MCPServer) *coreac.ServiceApplyConfiguration {
	p := port(s)
	return coreac.Service(s.Name, s.Namespace).
		WithLabels(labels(s)).
		WithOwnerReferences(owner(s)).
		WithSpec(coreac.ServiceSpec().
			WithType(corev1.ServiceTypeClusterIP).
			WithSelector(selector(s)).
			WithPorts(coreac.ServicePort().
				WithName("mcp").
				WithProtocol(corev1.ProtocolTCP).
				WithPort(p).
				WithTargetPort(intstr.FromString("mcp"))))
}

// networkPolicy denies everything but MCP traffic from the adapter's pods
// and egress to the allow-list (and DNS when asked for).
func networkPolicy(s *v1alpha1.MCPServer, o Options) *netac.NetworkPolicyApplyConfiguration {
	tcp := corev1.ProtocolTCP
	udp := corev1.ProtocolUDP
	ingress := netac.NetworkPolicyIngressRule().
		WithFrom(netac.NetworkPolicyPeer().
			WithNamespaceSelector(metaac.LabelSelector().
				WithMatchLabels(map[string]string{"kubernetes.io/metadata.name": o.AdapterNamespace})).
			WithPodSelector(metaac.LabelSelector().WithMatchLabels(maps.Clone(o.AdapterLabels)))).
		WithPorts(netac.NetworkPolicyPort().WithProtocol(tcp).WithPort(intstr.FromInt32(port(s))))

	var egress []*netac.NetworkPolicyEgressRuleApplyConfiguration
	for _, e := range s.Spec.Sandbox.Egress {
		r := netac.NetworkPolicyEgressRule().WithTo(netac.NetworkPolicyPeer().WithIPBlock(netac.IPBlock().WithCIDR(e.CIDR)))
		for _, p := range e.Ports {
			r.WithPorts(netac.NetworkPolicyPort().WithProtocol(tcp).WithPort(intstr.FromInt32(p)))
		}
		egress = append(egress, r)
	}
	if s.Spec.Sandbox.AllowDNS {
		egress = append(egress, netac.NetworkPolicyEgressRule().
			WithTo(netac.NetworkPolicyPeer().WithNamespaceSelector(metaac.LabelSelector())).
			WithPorts(
				netac.NetworkPolicyPort().WithProtocol(udp).WithPort(intstr.FromInt32(53)),
				netac.NetworkPolicyPort().WithProtocol(tcp).WithPort(intstr.FromInt32(53))))
	}
	return netac.NetworkPolicy(s.Name, s.Namespace).
		WithLabels(labels(s)).
		WithOwnerReferences(owner(s)).
		WithSpec(netac.NetworkPolicySpec().
			WithPodSelector(metaac.LabelSelector().WithMatchLabels(selector(s))).
			// Both types listed: whatever no rule allows is denied.
			WithPolicyTypes(networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress).
			WithIngress(ingress).
			WithEgress(egress...))
}

// restricted is the container security context the restricted Pod Security
// Standard asks for.
func restricted() *coreac.SecurityContextApplyConfiguration {
	return coreac.SecurityContext().
		WithRunAsNonRoot(true).
		WithRunAsUser(nonRootID).
		WithRunAsGroup(nonRootID).
		WithAllowPrivilegeEscalation(false).
		WithReadOnlyRootFilesystem(true).
		WithCapabilities(coreac.Capabilities().WithDrop("ALL")).
		WithSeccompProfile(coreac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault))
}

// deployment runs the server: one replica, restricted security context,
// read-only root filesystem with a bounded /work, the credential mounted as
// a file, and for stdio servers the bridge copied in by an init container.
func deployment(s *v1alpha1.MCPServer, o Options, hash string, revision int64) *appsac.DeploymentApplyConfiguration {
	p := port(s)
	workLimit := defaultWorkDirLimit
	if s.Spec.Sandbox.WorkDirSizeLimit != nil {
		workLimit = *s.Spec.Sandbox.WorkDirSizeLimit
	}
	tmpLimit := resource.MustParse("16Mi")

	env := []*coreac.EnvVarApplyConfiguration{
		coreac.EnvVar().WithName("HOME").WithValue(workDir),
		coreac.EnvVar().WithName("TMPDIR").WithValue("/tmp"),
	}
	for _, e := range s.Spec.Env {
		env = append(env, coreac.EnvVar().WithName(e.Name).WithValue(e.Value))
	}
	volumes := []*coreac.VolumeApplyConfiguration{
		coreac.Volume().WithName("work").WithEmptyDir(coreac.EmptyDirVolumeSource().WithSizeLimit(workLimit)),
		coreac.Volume().WithName("tmp").WithEmptyDir(coreac.EmptyDirVolumeSource().WithSizeLimit(tmpLimit)),
	}
	mounts := []*coreac.VolumeMountApplyConfiguration{
		coreac.VolumeMount().WithName("work").WithMountPath(workDir),
		coreac.VolumeMount().WithName("tmp").WithMountPath("/tmp"),
	}
	if c := s.Spec.Credentials; c != nil {
		volumes = append(volumes, coreac.Volume().WithName("credentials").WithSecret(
			coreac.SecretVolumeSource().
				WithSecretName(c.SecretRef.Name).
				WithItems(coreac.KeyToPath().WithKey(c.SecretRef.Key).WithPath(c.SecretRef.Key)).
				WithDefaultMode(0o440)))
		mounts = append(mounts, coreac.VolumeMount().WithName("credentials").WithMountPath(credentialsDir).WithReadOnly(true))
		env = append(env, coreac.EnvVar().WithName("V0M3_CREDENTIAL_FILE").WithValue(credentialsDir+"/"+c.SecretRef.Key))
		if c.EnvName != "" {
			env = append(env, coreac.EnvVar().WithName(c.EnvName).WithValueFrom(coreac.EnvVarSource().
				WithSecretKeyRef(coreac.SecretKeySelector().WithName(c.SecretRef.Name).WithKey(c.SecretRef.Key))))
		}
	}

	server := coreac.Container().
		WithName("server").
		WithImage(s.Spec.Image).
		WithImagePullPolicy(corev1.PullIfNotPresent).
		WithWorkingDir(workDir).
		WithEnv(env...).
		WithPorts(coreac.ContainerPort().WithName("mcp").WithContainerPort(p).WithProtocol(corev1.ProtocolTCP)).
		WithReadinessProbe(coreac.Probe().WithTCPSocket(coreac.TCPSocketAction().WithPort(intstr.FromString("mcp")))).
		WithSecurityContext(restricted()).
		WithResources(resources(s))

	pod := coreac.PodSpec().
		WithServiceAccountName(s.Name).
		WithAutomountServiceAccountToken(false).
		WithEnableServiceLinks(false).
		WithSecurityContext(coreac.PodSecurityContext().
			WithRunAsNonRoot(true).
			WithRunAsUser(nonRootID).
			WithRunAsGroup(nonRootID).
			WithFSGroup(nonRootID).
			WithSeccompProfile(coreac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault)))

	if s.Spec.Transport.Type == v1alpha1.TransportStdio {
		// The bridge serves streamable HTTP and runs the server's command as
		// its child over stdio. The server image need not contain it: an
		// init container copies the v0m3 binary into a shared emptyDir.
		volumes = append(volumes, coreac.Volume().WithName("bridge").
			WithEmptyDir(coreac.EmptyDirVolumeSource().WithSizeLimit(resource.MustParse("128Mi"))))
		mounts = append(mounts, coreac.VolumeMount().WithName("bridge").WithMountPath(bridgeDir).WithReadOnly(true))
		pod.WithInitContainers(coreac.Container().
			WithName("install-bridge").
			WithImage(o.BridgeImage).
			WithImagePullPolicy(corev1.PullIfNotPresent).
			WithArgs("bridge", "--install", bridgeDir).
			WithVolumeMounts(coreac.VolumeMount().WithName("bridge").WithMountPath(bridgeDir)).
			WithSecurityContext(restricted()).
			WithResources(coreac.ResourceRequirements().
				WithRequests(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")}).
				WithLimits(corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")})))
		// The bridge answers only requests naming its Service (what the
		// registered endpoint uses) or loopback: anything else is refused
		// before a child starts, against DNS rebinding.
		hosts := strings.Join([]string{s.Name, s.Name + "." + s.Namespace, s.Name + "." + s.Namespace + ".svc",
			s.Name + "." + s.Namespace + ".svc." + o.ClusterDomain}, ",")
		args := append([]string{"bridge", "--allowed-hosts", hosts, "--listen", ":" + itoa(p), "--path", path(s), "--"}, s.Spec.Command...)
		server.WithCommand(bridgeBinary).WithArgs(append(args, s.Spec.Args...)...)
	} else {
		if len(s.Spec.Command) > 0 {
			server.WithCommand(s.Spec.Command...)
		}
		if len(s.Spec.Args) > 0 {
			server.WithArgs(s.Spec.Args...)
		}
	}
	server.WithVolumeMounts(mounts...)
	// A replaced pod keeps answering on the connections it has (the
	// adapter's sessions of the previous config revision) for drainDelay
	// after it leaves the Service, so the operator can move the registry's
	// serving revision to the new pods before the old ones stop: calls in
	// flight finish on the old credential, new calls use the new one.
	server.WithLifecycle(coreac.Lifecycle().WithPreStop(coreac.LifecycleHandler().
		WithSleep(coreac.SleepAction().WithSeconds(int64(drainDelay / time.Second)))))
	pod.WithContainers(server).WithVolumes(volumes...)

	return appsac.Deployment(s.Name, s.Namespace).
		WithLabels(labels(s)).
		WithOwnerReferences(owner(s)).
		WithSpec(appsac.DeploymentSpec().
			WithReplicas(1).
			// A new pod must be available before an old one goes: a
			// rotation whose pods never become ready (the server refuses
			// the new credential) leaves the old pods serving.
			WithStrategy(appsac.DeploymentStrategy().
				WithType(appsv1.RollingUpdateDeploymentStrategyType).
				WithRollingUpdate(appsac.RollingUpdateDeployment().
					WithMaxUnavailable(intstr.FromInt32(0)).
					WithMaxSurge(intstr.FromInt32(1)))).
			WithSelector(metaac.LabelSelector().WithMatchLabels(selector(s))).
			WithTemplate(coreac.PodTemplateSpec().
				WithLabels(labels(s)).
				WithAnnotations(map[string]string{
					AnnotationConfigHash:     hash,
					AnnotationConfigRevision: itoa64(revision),
				}).
				WithSpec(pod)))
}

// resources copies the spec's resource requirements into an apply
// configuration.
func resources(s *v1alpha1.MCPServer) *coreac.ResourceRequirementsApplyConfiguration {
	r := coreac.ResourceRequirements()
	if l := s.Spec.Sandbox.Resources.Limits; len(l) > 0 {
		r.WithLimits(l)
	}
	if q := s.Spec.Sandbox.Resources.Requests; len(q) > 0 {
		r.WithRequests(q)
	}
	return r
}
