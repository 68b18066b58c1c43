package orchestrator

import (
	"testing"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

func TestObservesFollowsResultKind(t *testing.T) {
	t.Parallel()
	const (
		retrieval = registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL
		local     = registryv1.EffectClass_EFFECT_CLASS_LOCAL_TRANSFORMATION
		external  = registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT
		unsetFx   = registryv1.EffectClass_EFFECT_CLASS_UNSPECIFIED
		unset     = registryv1.ResultKind_RESULT_KIND_UNSPECIFIED
		source    = registryv1.ResultKind_RESULT_KIND_SOURCE_OBSERVATION
		artifact  = registryv1.ResultKind_RESULT_KIND_ARTIFACT
		rcpt      = registryv1.ResultKind_RESULT_KIND_RECEIPT
		data      = registryv1.ResultKind_RESULT_KIND_DATA
	)
	tests := []struct {
		effect registryv1.EffectClass
		kind   registryv1.ResultKind
		want   bool
	}{
		// Undeclared: the effect class decides, as before result kinds.
		{retrieval, unset, true},
		{local, unset, false},
		{external, unset, false},
		{unsetFx, unset, false},
		// Declared: the result kind decides.
		{retrieval, source, true},
		{retrieval, data, true},
		{retrieval, artifact, false},
		{retrieval, rcpt, false},
		{local, source, true},
		{local, data, true},
		{local, artifact, false},
		// An external effect needs a receipt whatever it declares.
		{external, source, false},
		{external, data, false},
		{external, rcpt, false},
		// A kind this orchestrator does not know falls back on the class.
		{retrieval, registryv1.ResultKind(42), true},
		{local, registryv1.ResultKind(42), false},
	}
	for _, tc := range tests {
		c := &registryv1.Capability{EffectClass: tc.effect, ResultKind: tc.kind}
		if got := observes(c); got != tc.want {
			t.Errorf("observes(%s, %s) = %t, want %t", tc.effect, tc.kind, got, tc.want)
		}
	}
}

// A retrieval declared to produce a receipt is not believed on the strength
// of the content it returns: without a receipt its outcome is unknown, and
// nothing becomes a source observation.
func TestDeclaredReceiptResultNeedsAReceipt(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.registry.mu.Lock()
	h.registry.capabilities[capRetrieveAuthorizedSource].ResultKind = registryv1.ResultKind_RESULT_KIND_RECEIPT
	h.registry.mu.Unlock()
	cat := h.start(t, "source_review", false).GetCatalogue()
	r, err := h.submit(t, cat.GetTaskId(), "call_1", capRetrieveAuthorizedSource,
		map[string]any{"source": handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	att := r.GetAttempts()[len(r.GetAttempts())-1]
	if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_FAILED || len(r.GetExcerpts()) != 0 ||
		att.GetOutcome() != adapterv1.Outcome_OUTCOME_UNKNOWN || att.GetError().GetSafeCode() != codeReceiptMissing {
		t.Errorf("request = %v", r)
	}
	if obs := h.evidence.observationsOf(cat.GetTaskId()); len(obs) != 0 {
		t.Errorf("observations = %v, want none", obs)
	}
}
