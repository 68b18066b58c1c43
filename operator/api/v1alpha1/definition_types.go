package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// AnnotationAdopt, set to "true" on a Capability or TaskProfile, lets it
// take over a registry definition of the same name that is active and
// managed by someone else (the shipped defaults, a person with the CLI).
// Without it such a resource is refused with reason NameClaimed and the
// definition is left as it is.
const AnnotationAdopt = "v0m3.dev/adopt"

// Condition types of a Capability or TaskProfile (Ready and ReviewRequired
// are shared with MCPServer).
const (
	// ConditionAccepted is True when the registry accepted the current
	// spec (generation) as the definition's current revision. False says
	// why not: the registry's ErrorInfo reason in CamelCase (e.g.
	// InvalidSchema), NameClaimed, CapabilityUnknown.
	ConditionAccepted = "Accepted"
)

// Condition reasons of a Capability or TaskProfile. A refusal's reason is
// the registry's ErrorInfo reason in CamelCase (INVALID_SCHEMA becomes
// InvalidSchema); these are the operator's own.
const (
	ReasonRevisionRecorded = "RevisionRecorded"
	ReasonInForce          = "InForce"
	ReasonNameClaimed      = "NameClaimed"
	ReasonNotDeclared      = "NotDeclared"
	ReasonDeprecated       = "DeprecatedOutsideKubernetes"
	ReasonRegistryRefused  = "RegistryRefused"
	ReasonInvalidSpec      = "InvalidSpec"
	ReasonNothingToReview  = "NothingToReview"
	ReasonConcurrentChange = "ConcurrentChange"
)

// DefinitionStatus is what Capability and TaskProfile status share.
type DefinitionStatus struct {
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Accepted, Ready (and ReviewRequired for a Capability).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// RegistryName is the definition's name in the registry.
	// +optional
	RegistryName string `json:"registryName,omitempty"`

	// Revision is the registry revision in force for this resource. When a
	// new spec is refused it stays at the last accepted revision.
	// +optional
	Revision int64 `json:"revision,omitempty"`

	// AcceptedGeneration is the spec generation Revision declares.
	// +optional
	AcceptedGeneration int64 `json:"acceptedGeneration,omitempty"`

	// State is the definition's registry lifecycle state: Active or
	// Deprecated.
	// +optional
	State string `json:"state,omitempty"`

	// ManagedBy is what the registry records as the definition's manager.
	// +optional
	ManagedBy string `json:"managedBy,omitempty"`

	// Refusal is why the registry refused the current spec; unset once a
	// spec is accepted.
	// +optional
	Refusal *RegistryRefusal `json:"refusal,omitempty"`
}

// RegistryRefusal is a registry error as its google.rpc.ErrorInfo and
// BadRequest say it.
type RegistryRefusal struct {
	// Code is the gRPC status code, e.g. InvalidArgument.
	Code string `json:"code"`
	// Reason is the registry's ErrorInfo reason, e.g. INVALID_SCHEMA.
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message is the registry's message.
	Message string `json:"message"`
	// FieldViolations name the fields at fault, as spec paths where the
	// registry's field maps onto one (capability.input_schema becomes
	// spec.inputSchema).
	// +optional
	// +listType=atomic
	FieldViolations []FieldViolation `json:"fieldViolations,omitempty"`
}

// FieldViolation is one field the registry refused.
type FieldViolation struct {
	// Field is the spec path, e.g. spec.handles[0].field.
	Field string `json:"field"`
	// Description says what is wrong and how to fix it.
	Description string `json:"description"`
}
