package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Conditions under which a task profile needs a capability.
const (
	NeedAlways          = "Always"
	NeedEvidenceAbsent  = "EvidenceAbsent"
	NeedEvidencePresent = "EvidencePresent"
)

// TaskProfileSpec is what a kind of task needs, as the registry's
// TaskProfile holds it.
type TaskProfileSpec struct {
	// Description says what the kind of task is for, in words.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Description string `json:"description,omitempty"`

	// Purpose is what policy evaluates; empty means the profile's registry
	// name.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Purpose string `json:"purpose,omitempty"`

	// Needs are the capabilities its tasks may need and when. A capability
	// not named here is never offered to its tasks.
	// +optional
	// +listType=map
	// +listMapKey=capability
	// +kubebuilder:validation:MaxItems=64
	Needs []ProfileNeed `json:"needs,omitempty"`

	// DefaultBudget is its tasks' default budget; 0 (or unset) in a
	// dimension means policy's configured default.
	// +optional
	DefaultBudget *TaskBudget `json:"defaultBudget,omitempty"`
}

// ProfileNeed is one capability a profile may need.
type ProfileNeed struct {
	// Capability is the capability's registry name (lower snake case,
	// e.g. read_project_file), whether a Capability resource or the
	// registry's API declared it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	Capability string `json:"capability"`

	// When it is needed: Always (the default), EvidenceAbsent (only while
	// the task has no evidence yet) or EvidencePresent.
	// +optional
	// +kubebuilder:validation:Enum=Always;EvidenceAbsent;EvidencePresent
	When string `json:"when,omitempty"`
}

// TaskBudget is a task's default budget.
type TaskBudget struct {
	// MaxCalls bounds governed calls.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxCalls int64 `json:"maxCalls,omitempty"`
	// MaxResponseBytes bounds response bytes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxResponseBytes int64 `json:"maxResponseBytes,omitempty"`
	// MaxCostMicros bounds cost, in micro-units.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxCostMicros int64 `json:"maxCostMicros,omitempty"`
}

// TaskProfileStatus is what the operator observed in the registry.
type TaskProfileStatus struct {
	DefinitionStatus `json:",inline"`
}

// TaskProfile declares what a kind of task needs in the registry. It is
// cluster-scoped because profile names are global in the registry: the
// resource's name, with hyphens written as underscores, is the registry
// name (code-review declares code_review, the profile StartTask names).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=tprof,categories=v0m3
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z][a-z0-9]*(-[a-z0-9]+)*$')",message="the name becomes the registry name with hyphens written as underscores: lower-case words joined by single hyphens, e.g. code-review"
// +kubebuilder:printcolumn:name="Registry Name",type=string,JSONPath=`.status.registryName`
// +kubebuilder:printcolumn:name="Revision",type=integer,JSONPath=`.status.revision`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].reason`
// +kubebuilder:printcolumn:name="Needs",type=string,JSONPath=`.spec.needs[*].capability`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TaskProfile struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TaskProfileSpec   `json:"spec,omitempty"`
	Status TaskProfileStatus `json:"status,omitempty"`
}

// TaskProfileList is a list of TaskProfiles.
//
// +kubebuilder:object:root=true
type TaskProfileList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TaskProfile `json:"items"`
}
