package controller

import "testing"

// Registry field paths become the spec paths a person edits.
func TestSpecPath(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"capability.input_schema":                   "spec.inputSchema",
		"capability.handles[2].refers_to":           "spec.handles[2].refersTo",
		"capability.default_limits.max_items":       "spec.defaultLimits.maxItems",
		"capability.idempotency_required":           "spec.idempotencyRequired",
		"capability.name":                           "metadata.name",
		"profile.needs[0].capability":               "spec.needs[0].capability",
		"profile.default_budget.max_response_bytes": "spec.defaultBudget.maxResponseBytes",
		"expected_revision":                         "expected_revision",
	} {
		if got := specPath(in); got != want {
			t.Errorf("specPath(%q) = %q; want %q", in, got, want)
		}
	}
}

// Registry reasons become valid condition reasons; anything that cannot
// be one falls back to RegistryRefused instead of a status the API server
// would reject.
func TestConditionReason(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"INVALID_SCHEMA":               "InvalidSchema",
		"EXTERNAL_EFFECT_REQUIREMENTS": "ExternalEffectRequirements",
		"CAPABILITY_UNKNOWN":           "CapabilityUnknown",
		"":                             "RegistryRefused",
		"9LIVES":                       "RegistryRefused",
		"BAD-REASON":                   "RegistryRefused",
	} {
		if got := conditionReason(in); got != want {
			t.Errorf("conditionReason(%q) = %q; want %q", in, got, want)
		}
	}
}

// Kubernetes names map one to one onto registry names.
func TestRegistryName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"read-project-file": "read_project_file",
		"export":            "export",
		"a1-b2":             "a1_b2",
	} {
		if got := registryName(in); got != want {
			t.Errorf("registryName(%q) = %q; want %q", in, got, want)
		}
	}
}
