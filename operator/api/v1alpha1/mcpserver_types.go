package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Transport types.
const (
	// TransportStdio runs the server's command as a child of `v0m3 bridge`,
	// which serves it over streamable HTTP.
	TransportStdio = "stdio"
	// TransportStreamableHTTP is a server that already speaks MCP
	// streamable HTTP on spec.transport.port.
	TransportStreamableHTTP = "streamableHTTP"
)

// MCPServerSpec is what a platform team asks for: one MCP server, its image,
// how it is spoken to, its non-secret configuration, the credential it uses
// and the sandbox it runs in.
//
// +kubebuilder:validation:XValidation:rule="self.transport.type != 'stdio' || (has(self.command) && size(self.command) > 0)",message="a stdio server needs spec.command: v0m3 bridge runs it as its child and speaks MCP over its stdin/stdout"
type MCPServerSpec struct {
	// Image is the server's container image, pinned by digest
	// (registry/name@sha256:<64 hex>, a tag may precede the digest) so the
	// registry records exactly what runs.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('^[^\\\\s@]+@sha256:[a-f0-9]{64}$')",message="image must be pinned by digest, e.g. ghcr.io/acme/search@sha256:<64 hex digits>; a tag alone can change what runs without a new config revision"
	Image string `json:"image"`

	// Transport says how the server speaks MCP.
	Transport TransportSpec `json:"transport"`

	// Command is the server's executable and its leading arguments. For
	// stdio servers it is required: the bridge runs it. For streamable HTTP
	// servers it overrides the image's entrypoint when set.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	Command []string `json:"command,omitempty"`

	// Args follow Command.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Args []string `json:"args,omitempty"`

	// Env is non-secret environment for the server. Secrets belong in
	// spec.credentials, never here.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Env []EnvVar `json:"env,omitempty"`

	// Credentials names the Secret the server uses, with a human description
	// of what it may do. The operator never reads the Secret's data: only its
	// resourceVersion, so a rotation becomes a new config revision.
	// +optional
	Credentials *CredentialsSpec `json:"credentials,omitempty"`

	// Sandbox bounds the pod: resources, working directory and egress.
	// +optional
	Sandbox SandboxSpec `json:"sandbox,omitempty"`

	// Owner is the team or person responsible for the server. It is
	// recorded on the registry connection.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Owner string `json:"owner"`

	// DisplayName is a friendly name for people; defaults to the resource's
	// namespace/name. It is never used as identity.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	DisplayName string `json:"displayName,omitempty"`
}

// TransportSpec says how the server speaks MCP.
//
// +kubebuilder:validation:XValidation:rule="self.type != 'streamableHTTP' || has(self.port)",message="a streamableHTTP server needs spec.transport.port: the port it serves MCP on"
type TransportSpec struct {
	// Type is stdio (served through v0m3 bridge) or streamableHTTP.
	// +kubebuilder:validation:Enum=stdio;streamableHTTP
	Type string `json:"type"`

	// Port the server (or the bridge, for stdio) listens on in the pod.
	// Defaults to 8080 for stdio servers.
	// +optional
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`

	// Path of the MCP endpoint.
	// +optional
	// +kubebuilder:default="/mcp"
	// +kubebuilder:validation:Pattern=`^/[A-Za-z0-9._~/-]*$`
	// +kubebuilder:validation:MaxLength=256
	Path string `json:"path,omitempty"`
}

// EnvVar is one non-secret environment variable.
type EnvVar struct {
	// Name of the variable.
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name"`
	// Value of the variable. Never a secret.
	// +kubebuilder:validation:MaxLength=4096
	Value string `json:"value"`
}

// CredentialsSpec names the Secret a server uses.
type CredentialsSpec struct {
	// SecretRef names a Secret in the MCPServer's namespace and the key
	// holding the credential.
	SecretRef SecretKeyRef `json:"secretRef"`

	// Scope is a safe, human description of what the credential may do,
	// e.g. "read-only access to the docs search index". Shown to
	// reviewers; never the secret itself.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Scope string `json:"scope"`

	// EnvName, when set, also exposes the credential to the server as this
	// environment variable (many servers read a token from the
	// environment). The file under /var/run/secrets/v0m3/credentials is
	// always mounted.
	// +optional
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	// +kubebuilder:validation:MaxLength=128
	EnvName string `json:"envName,omitempty"`
}

// SecretKeyRef names one key of a Secret in the same namespace.
type SecretKeyRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
	// Key inside the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key"`
}

// SandboxSpec bounds the pod a server runs in.
type SandboxSpec struct {
	// Resources of the server container. Limits are strongly advised.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// WorkDirSizeLimit bounds the writable working directory (an emptyDir
	// at /work; the root filesystem is read-only).
	// +optional
	// +kubebuilder:default="64Mi"
	WorkDirSizeLimit *resource.Quantity `json:"workDirSizeLimit,omitempty"`

	// Egress is the allow-list of destinations the server may reach.
	// Everything else is denied, including DNS unless allowDNS is set.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Egress []EgressRule `json:"egress,omitempty"`

	// AllowDNS lets the server resolve names through the cluster DNS
	// (port 53 in any namespace). Off by default.
	// +optional
	AllowDNS bool `json:"allowDNS,omitempty"`
}

// EgressRule allows traffic to one network on some ports.
type EgressRule struct {
	// CIDR of the destination, e.g. 203.0.113.0/24.
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="egress cidr must be a CIDR such as 203.0.113.0/24 or 2001:db8::/32"
	CIDR string `json:"cidr"`

	// Ports allowed to that network (TCP). Empty allows every port.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=65535
	Ports []int32 `json:"ports,omitempty"`
}

// Condition types of an MCPServer.
const (
	// ConditionReady is True when the workload is available and the
	// registry connection matches the current configuration.
	ConditionReady = "Ready"
	// ConditionDiscovered is True once the registry holds a discovery
	// snapshot taken at the current config revision.
	ConditionDiscovered = "Discovered"
	// ConditionReviewRequired is True while the connection or one of its
	// mappings waits for a person's review.
	ConditionReviewRequired = "ReviewRequired"
	// ConditionCredentialsReady is True when the referenced Secret exists and
	// the running pods use its current version.
	ConditionCredentialsReady = "CredentialsReady"
	// ConditionServing is True when the registry serves the latest config
	// revision (its pods rolled out); False while a newer revision rolls
	// out or after its rollout failed, when the previous one keeps serving.
	ConditionServing = "Serving"
)

// Condition reasons of an MCPServer.
const (
	ReasonAvailable           = "Available"
	ReasonProgressing         = "Progressing"
	ReasonRegistryUnavailable = "RegistryUnavailable"
	ReasonRegistryRejected    = "RegistryRejected"
	ReasonConnectionRetired   = "ConnectionRetired"
	ReasonSecretNotFound      = "SecretNotFound"
	ReasonNoCredentials       = "NoCredentials"
	ReasonCredentialsCurrent  = "CredentialsCurrent"
	ReasonRotationInProgress  = "RotationInProgress"
	ReasonRotationFailed      = "RotationFailed"
	ReasonRolloutFailed       = "RolloutFailed"
	ReasonServingLatest       = "ServingLatest"
	ReasonRolloutPending      = "RolloutPending"
	ReasonAwaitingDiscovery   = "AwaitingDiscovery"
	ReasonSnapshotRecorded    = "SnapshotRecorded"
	ReasonSnapshotOutdated    = "SnapshotOutdated"
	ReasonConnectionPending   = "ConnectionPendingReview"
	ReasonMappingsNeedReview  = "MappingsNeedReview"
	ReasonReviewed            = "Reviewed"
	ReasonConnectionRejected  = "ConnectionRejected"
)

// MCPServerStatus is what the operator observed and did.
type MCPServerStatus struct {
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, Discovered, ReviewRequired, CredentialsReady,
	// Serving.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ConnectionID is the registry connection of this server.
	// +optional
	ConnectionID string `json:"connectionID,omitempty"`

	// ConfigRevision is the registry's latest config revision: the one the
	// pod template carries.
	// +optional
	ConfigRevision int64 `json:"configRevision,omitempty"`

	// ServingConfigRevision is the registry's config revision that calls
	// execute at: ConfigRevision once its pods rolled out, the previous
	// one while they roll out or when their rollout failed.
	// +optional
	ServingConfigRevision int64 `json:"servingConfigRevision,omitempty"`

	// DesiredReplicas is how many pods the Deployment wants.
	// +optional
	DesiredReplicas int32 `json:"desiredReplicas,omitempty"`

	// UpdatedReadyReplicas is how many of them run the current pod
	// template and are available: the rollout's progress.
	// +optional
	UpdatedReadyReplicas int32 `json:"updatedReadyReplicas,omitempty"`

	// ConfigDigest is the registry's digest of that revision.
	// +optional
	ConfigDigest string `json:"configDigest,omitempty"`

	// ConfigHash is the operator's digest of everything that shapes the
	// workload (spec, image digest, credential version). It is stamped on
	// the pod template, so a change rolls the Deployment.
	// +optional
	ConfigHash string `json:"configHash,omitempty"`

	// ImageDigest is the digest the image is pinned to.
	// +optional
	ImageDigest string `json:"imageDigest,omitempty"`

	// CredentialVersion is the referenced Secret's resourceVersion at the
	// current config revision. Never derived from the Secret's data.
	// +optional
	CredentialVersion string `json:"credentialVersion,omitempty"`

	// Endpoint is the in-cluster MCP endpoint registered for the adapter.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// LatestSnapshotDigest is the digest of the registry's latest discovery
	// snapshot of this connection.
	// +optional
	LatestSnapshotDigest string `json:"latestSnapshotDigest,omitempty"`

	// Rotation is the latest credential rotation, kept after it completes.
	// +optional
	Rotation *RotationStatus `json:"rotation,omitempty"`
}

// RotationStatus tracks one credential rotation from the Secret change to
// the new pods being available.
type RotationStatus struct {
	// FromRevision is the config revision before the rotation.
	FromRevision int64 `json:"fromRevision"`
	// ToRevision is the config revision the rotation created.
	ToRevision int64 `json:"toRevision"`
	// CredentialVersion is the Secret resourceVersion rotated to.
	CredentialVersion string `json:"credentialVersion"`
	// StartTime is when the operator saw the new Secret version.
	StartTime metav1.Time `json:"startTime"`
	// CompletionTime is when the Deployment reported the new pods
	// available; unset while the rotation is in progress.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// Failure says why the rotation's pods did not roll out, when they did
	// not; FromRevision keeps serving. Cleared if they roll out after all.
	// +optional
	Failure string `json:"failure,omitempty"`
}

// MCPServer runs one MCP server in a sandboxed pod and registers it as a
// V0M3 registry connection. Registering makes nothing usable by itself:
// capabilities still need reviewed mappings.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=mcps,categories=v0m3
// +kubebuilder:printcolumn:name="Transport",type=string,JSONPath=`.spec.transport.type`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Revision",type=integer,JSONPath=`.status.configRevision`
// +kubebuilder:printcolumn:name="Serving",type=integer,JSONPath=`.status.servingConfigRevision`
// +kubebuilder:printcolumn:name="Credentials",type=string,JSONPath=`.status.conditions[?(@.type=="CredentialsReady")].reason`
// +kubebuilder:printcolumn:name="Review",type=string,JSONPath=`.status.conditions[?(@.type=="ReviewRequired")].reason`
// +kubebuilder:printcolumn:name="Connection",type=string,JSONPath=`.status.connectionID`,priority=1
// +kubebuilder:printcolumn:name="Snapshot",type=string,JSONPath=`.status.latestSnapshotDigest`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MCPServer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MCPServerSpec   `json:"spec"`
	Status MCPServerStatus `json:"status,omitempty"`
}

// MCPServerList is a list of MCPServers.
//
// +kubebuilder:object:root=true
type MCPServerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MCPServer `json:"items"`
}
