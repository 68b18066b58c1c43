package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Effect classes of a Capability.
const (
	EffectRetrieval           = "Retrieval"
	EffectLocalTransformation = "LocalTransformation"
	EffectExternalEffect      = "ExternalEffect"
)

// Retry rules of a Capability.
const (
	RetryRetry        = "Retry"
	RetryCheckReceipt = "CheckReceipt"
	RetryNeverBlind   = "NeverBlind"
)

// Result kinds of a Capability.
const (
	ResultSourceObservation = "SourceObservation"
	ResultArtifact          = "Artifact"
	ResultReceipt           = "Receipt"
	ResultData              = "Data"
)

// Handle kinds of a Capability's handle field.
const (
	HandleSource      = "Source"
	HandleArtifact    = "Artifact"
	HandleDestination = "Destination"
)

// Approval requirements of a Capability.
const (
	ApprovalPolicy = "Policy"
	ApprovalAlways = "Always"
)

// CapabilitySpec is a V0M3 product contract, as the registry's Capability
// holds it. The registry validates it (one place for the rules) and keeps
// every revision; the CRD checks only shapes and enums.
type CapabilitySpec struct {
	// EffectClass is what kind of consequence the capability has:
	// Retrieval reads within a source scope, LocalTransformation produces
	// local artifacts, ExternalEffect changes something outside V0M3 and
	// always needs a person's approval of the exact consequence.
	// +kubebuilder:validation:Enum=Retrieval;LocalTransformation;ExternalEffect
	EffectClass string `json:"effectClass"`

	// InputSchema is the JSON Schema (2020-12) of the product request, an
	// object schema. Local $defs/$ref are resolved by the registry before
	// it is digested; unknown request fields always fail.
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	InputSchema runtime.RawExtension `json:"inputSchema"`

	// Description is the local description the model sees: the only one it
	// ever receives for this capability, never a remote tool's.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Description string `json:"description"`

	// Preconditions, in words.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=1024
	Preconditions []string `json:"preconditions,omitempty"`

	// ResultState is the resulting product state, in words.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	ResultState string `json:"resultState,omitempty"`

	// Authority says who may authorize it, in words.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Authority string `json:"authority,omitempty"`

	// Evidence says what evidence it leaves, in words.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Evidence string `json:"evidence,omitempty"`

	// RetryRule says what a new attempt after a failure may do: Retry (a
	// bounded read), CheckReceipt (look for a receipt first) or NeverBlind
	// (never retry an unknown outcome without a person).
	// +kubebuilder:validation:Enum=Retry;CheckReceipt;NeverBlind
	RetryRule string `json:"retryRule"`

	// RecoveryLimits are the known recovery limits, in words.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	RecoveryLimits string `json:"recoveryLimits,omitempty"`

	// Handles are the product fields that carry handles rather than values.
	// +optional
	// +listType=map
	// +listMapKey=field
	// +kubebuilder:validation:MaxItems=32
	Handles []HandleField `json:"handles,omitempty"`

	// ResultKind is what a successful result becomes. Unset: by effect
	// class (SourceObservation, Artifact, Receipt).
	// +optional
	// +kubebuilder:validation:Enum=SourceObservation;Artifact;Receipt;Data
	ResultKind string `json:"resultKind,omitempty"`

	// IdempotencyRequired makes a mapping usable only when it names an
	// idempotency key field or a status tool. Required for external
	// effects.
	// +optional
	IdempotencyRequired bool `json:"idempotencyRequired,omitempty"`

	// DefaultLimits are the limits a new mapping starts from when its
	// proposal names none.
	// +optional
	DefaultLimits *Limits `json:"defaultLimits,omitempty"`

	// Approval says when a person must approve a request: Policy (Cedar
	// decides per request) or Always. Unset: by effect class.
	// +optional
	// +kubebuilder:validation:Enum=Policy;Always
	Approval string `json:"approval,omitempty"`

	// SummaryTemplate is how a request reads on an approval page, with
	// {field} placeholders for product fields.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	SummaryTemplate string `json:"summaryTemplate,omitempty"`
}

// HandleField is one product field that carries a handle, not a value.
type HandleField struct {
	// Field is a top-level string property of the input schema.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Field string `json:"field"`
	// RefersTo says what the handle names, in product words, e.g. source.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	RefersTo string `json:"refersTo"`
	// Kind is which of a task's scopes the field's handles come from, and
	// so which handles it accepts; empty means Source.
	// +optional
	// +kubebuilder:validation:Enum=Source;Artifact;Destination
	Kind string `json:"kind,omitempty"`
}

// Limits are enforced by the adapter while bytes arrive.
type Limits struct {
	// MaxResponseBytes bounds one response.
	// +kubebuilder:validation:Minimum=1
	MaxResponseBytes int64 `json:"maxResponseBytes"`
	// MaxItems bounds the content items of one response.
	// +kubebuilder:validation:Minimum=1
	MaxItems int32 `json:"maxItems"`
	// AllowedMediaTypes are the media types a response may carry.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=255
	AllowedMediaTypes []string `json:"allowedMediaTypes,omitempty"`
	// AssetReferenceAllowed lets large content be stored as an asset
	// reference.
	// +optional
	AssetReferenceAllowed bool `json:"assetReferenceAllowed,omitempty"`
}

// CapabilityStatus is what the operator observed in the registry.
type CapabilityStatus struct {
	DefinitionStatus `json:",inline"`

	// InputSchemaDigest is the registry's digest of the resolved input
	// schema at Revision.
	// +optional
	InputSchemaDigest string `json:"inputSchemaDigest,omitempty"`

	// MappingsNeedingReview counts the capability's mappings that wait for
	// a person's review, e.g. after a new revision. A person reviews them
	// through the registry, never the operator.
	// +optional
	MappingsNeedingReview int32 `json:"mappingsNeedingReview,omitempty"`
}

// Capability declares one V0M3 product capability in the registry. It is
// cluster-scoped because capability names are global in the registry: the
// resource's name, with hyphens written as underscores, is the registry
// name (read-project-file declares read_project_file).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=cap,categories=v0m3
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z][a-z0-9]*(-[a-z0-9]+)*$')",message="the name becomes the registry name with hyphens written as underscores: lower-case words joined by single hyphens, e.g. read-project-file"
// +kubebuilder:printcolumn:name="Registry Name",type=string,JSONPath=`.status.registryName`
// +kubebuilder:printcolumn:name="Effect",type=string,JSONPath=`.spec.effectClass`
// +kubebuilder:printcolumn:name="Revision",type=integer,JSONPath=`.status.revision`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].reason`
// +kubebuilder:printcolumn:name="Review",type=integer,JSONPath=`.status.mappingsNeedingReview`
// +kubebuilder:printcolumn:name="Schema",type=string,JSONPath=`.status.inputSchemaDigest`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Capability struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   CapabilitySpec   `json:"spec"`
	Status CapabilityStatus `json:"status,omitempty"`
}

// CapabilityList is a list of Capabilities.
//
// +kubebuilder:object:root=true
type CapabilityList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Capability `json:"items"`
}
