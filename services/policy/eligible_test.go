package policy

import (
	"context"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

func TestEligibleStagesAndReasons(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	ctx := context.Background()
	if _, err := e.client.ReportConnectionHealth(ctx, &policyv1.ReportConnectionHealthRequest{
		ConnectionId: connDegraded, State: policyv1.HealthState_HEALTH_STATE_DEGRADED, Detail: "3 timeouts",
	}); err != nil {
		t.Fatalf("ReportConnectionHealth: %v", err)
	}
	// A healthy report for conn_ok changes nothing.
	if _, err := e.client.ReportConnectionHealth(ctx, &policyv1.ReportConnectionHealthRequest{
		ConnectionId: connOK, State: policyv1.HealthState_HEALTH_STATE_HEALTHY,
	}); err != nil {
		t.Fatalf("ReportConnectionHealth: %v", err)
	}

	// bob is an author: render_preview is permitted but not needed;
	// delivery is denied; retrieval is needed and offered.
	resp, err := e.client.Eligible(ctx, &policyv1.EligibleRequest{
		TaskId: "task_1", Requester: bob(), Purpose: "source_review",
		NeededCapabilities: []string{capRetrieve, capDeliver, capSearch},
	})
	if err != nil {
		t.Fatalf("Eligible: %v", err)
	}
	if resp.GetPolicyRevision() != digest.Bytes(defaultPolicy) {
		t.Errorf("policy_revision = %q", resp.GetPolicyRevision())
	}

	const (
		unknown    = policyv1.EligibilityStage_ELIGIBILITY_STAGE_UNKNOWN
		discovered = policyv1.EligibilityStage_ELIGIBILITY_STAGE_DISCOVERED
		registered = policyv1.EligibilityStage_ELIGIBILITY_STAGE_REGISTERED
		eligible   = policyv1.EligibilityStage_ELIGIBILITY_STAGE_ELIGIBLE
		offered    = policyv1.EligibilityStage_ELIGIBILITY_STAGE_OFFERED

		none       = policyv1.NotOfferedReason_NOT_OFFERED_REASON_UNSPECIFIED
		missing    = policyv1.NotOfferedReason_NOT_OFFERED_REASON_REGISTRATION_MISSING
		denied     = policyv1.NotOfferedReason_NOT_OFFERED_REASON_POLICY_DENIED
		degraded   = policyv1.NotOfferedReason_NOT_OFFERED_REASON_CONNECTION_DEGRADED
		notNeeded  = policyv1.NotOfferedReason_NOT_OFFERED_REASON_NOT_NEEDED
		retrieval  = registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL
		localXform = registryv1.EffectClass_EFFECT_CLASS_LOCAL_TRANSFORMATION
		external   = registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT
	)
	want := []struct {
		capability string
		stage      policyv1.EligibilityStage
		reason     policyv1.NotOfferedReason
		detail     string
		mappingID  string
		mappingRev int64
		connection string
		effect     registryv1.EffectClass
		policies   []string
	}{
		{capLinks, discovered, missing, "mapping map_links revision 2 is review_required", "", 0, "", retrieval, nil},
		{capDeliver, registered, denied, "external effect disabled", "map_deliver", 1, connOK, external, []string{ExternalEffectNeedsIdempotency}},
		{capArchive, registered, degraded, "connection conn_retired is retired", "map_archive", 1, connRetired, retrieval, nil},
		{capPreview, eligible, notNeeded, "does not need", "map_preview", 1, connOK, localXform, []string{"authors-render-preview"}},
		{capRetrieve, offered, none, "", mapRetrieve, 2, connOK, retrieval, []string{"retrieval-for-review-and-rewrite"}},
		{capSearch, registered, degraded, "connection conn_degraded reported degraded", "map_search", 1, connDegraded, retrieval, nil},
		{capSummary, unknown, missing, "no mapping", "", 0, "", retrieval, nil},
	}
	got := resp.GetCapabilities()
	var names []string
	for _, c := range got {
		names = append(names, c.GetCapability())
	}
	if !slices.IsSorted(names) {
		t.Errorf("capabilities not sorted by name: %v", names)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d capabilities %v, want %d", len(got), names, len(want))
	}
	for i, w := range want {
		c := got[i]
		if c.GetCapability() != w.capability {
			t.Errorf("[%d] capability = %q, want %q", i, c.GetCapability(), w.capability)
			continue
		}
		if c.GetStage() != w.stage || c.GetReason() != w.reason {
			t.Errorf("%s: stage/reason = %v/%v, want %v/%v (%q)", w.capability, c.GetStage(), c.GetReason(), w.stage, w.reason, c.GetDetail())
		}
		if !strings.Contains(c.GetDetail(), w.detail) || (w.detail == "" && c.GetDetail() != "") {
			t.Errorf("%s: detail = %q, want it to contain %q", w.capability, c.GetDetail(), w.detail)
		}
		if c.GetMappingId() != w.mappingID || c.GetMappingRevision() != w.mappingRev || c.GetConnectionId() != w.connection {
			t.Errorf("%s: mapping = %s@%d on %s, want %s@%d on %s", w.capability,
				c.GetMappingId(), c.GetMappingRevision(), c.GetConnectionId(), w.mappingID, w.mappingRev, w.connection)
		}
		if c.GetEffectClass() != w.effect {
			t.Errorf("%s: effect class = %v, want %v", w.capability, c.GetEffectClass(), w.effect)
		}
		if !slices.Equal(c.GetPolicyReasons(), w.policies) {
			t.Errorf("%s: policy reasons = %v, want %v", w.capability, c.GetPolicyReasons(), w.policies)
		}
	}
}

func TestEligibleFollowsPurposeAndHealth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	ctx := context.Background()
	stageOf := func(purpose, capability string) (policyv1.EligibilityStage, policyv1.NotOfferedReason) {
		t.Helper()
		resp, err := e.client.Eligible(ctx, &policyv1.EligibleRequest{
			TaskId: "task_2", Requester: alice(), Purpose: purpose, NeededCapabilities: []string{capability},
		})
		if err != nil {
			t.Fatalf("Eligible: %v", err)
		}
		for _, c := range resp.GetCapabilities() {
			if c.GetCapability() == capability {
				return c.GetStage(), c.GetReason()
			}
		}
		t.Fatalf("%s missing from eligibility", capability)
		return 0, 0
	}

	// A purpose the policy does not cover gets no retrieval.
	if st, r := stageOf("publish", capRetrieve); st != policyv1.EligibilityStage_ELIGIBILITY_STAGE_REGISTERED ||
		r != policyv1.NotOfferedReason_NOT_OFFERED_REASON_POLICY_DENIED {
		t.Errorf("publish purpose: %v/%v, want REGISTERED/POLICY_DENIED", st, r)
	}
	// Degraded, then healthy again: the latest report counts.
	for _, tc := range []struct {
		state policyv1.HealthState
		stage policyv1.EligibilityStage
	}{
		{policyv1.HealthState_HEALTH_STATE_DEGRADED, policyv1.EligibilityStage_ELIGIBILITY_STAGE_REGISTERED},
		{policyv1.HealthState_HEALTH_STATE_HEALTHY, policyv1.EligibilityStage_ELIGIBILITY_STAGE_OFFERED},
	} {
		if _, err := e.client.ReportConnectionHealth(ctx, &policyv1.ReportConnectionHealthRequest{ConnectionId: connOK, State: tc.state}); err != nil {
			t.Fatal(err)
		}
		if st, _ := stageOf("source_review", capRetrieve); st != tc.stage {
			t.Errorf("after %v: stage %v, want %v", tc.state, st, tc.stage)
		}
	}
	// A pending mapping next to an active one does not hide the active one.
	e.reg.putMapping("map_retrieve_next", capRetrieve, connOK, 1, registryv1.MappingState_MAPPING_STATE_PENDING_REVIEW)
	if st, _ := stageOf("source_review", capRetrieve); st != policyv1.EligibilityStage_ELIGIBILITY_STAGE_OFFERED {
		t.Errorf("with an extra pending mapping: stage %v, want OFFERED", st)
	}
}

func TestEligibleValidates(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	_, err := e.client.Eligible(context.Background(), &policyv1.EligibleRequest{TaskId: "task_1"})
	if apierror.Code(err) != codes.InvalidArgument {
		t.Fatalf("err = %v, want INVALID_ARGUMENT", err)
	}
	if got, want := apierror.Fields(err), []string{"purpose", "requester.id"}; !slices.Equal(got, want) {
		t.Errorf("fields = %v, want %v", got, want)
	}
}

func TestReportConnectionHealthValidates(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	_, err := e.client.ReportConnectionHealth(context.Background(), &policyv1.ReportConnectionHealthRequest{})
	if got, want := apierror.Fields(err), []string{"connection_id", "state"}; apierror.Code(err) != codes.InvalidArgument || !slices.Equal(got, want) {
		t.Fatalf("err = %v (fields %v), want INVALID_ARGUMENT on %v", err, got, want)
	}
}

// A capability that requires idempotency is offered only when its mapping
// lets V0M3 find out whether an attempt happened: an idempotency key or a
// status query. An external effect always requires it, whatever its
// contract declares.
func TestIdempotencyRequiredNeedsKeyOrStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		capability string
		required   bool
		key        string
		statusTool string
		offered    bool
		reason     string
	}{
		{"external, declared, neither", capDeliver, true, "", "", false, ExternalEffectNeedsIdempotency},
		{"external, not declared, neither: required anyway", capDeliver, false, "", "", false, ExternalEffectNeedsIdempotency},
		{"external, idempotency key", capDeliver, false, "request_id", "", true, ""},
		{"external, status query", capDeliver, true, "", "delivery_status", true, ""},
		{"local, not declared, neither", capPreview, false, "", "", true, ""},
		{"local, declared, neither", capPreview, true, "", "", false, CapabilityNeedsIdempotency},
		{"local, declared, idempotency key", capPreview, true, "request_id", "", true, ""},
		{"local, declared, status query", capPreview, true, "", "render_status", true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, options{})
			e.reg.mu.Lock()
			e.reg.caps[tt.capability].IdempotencyRequired = tt.required
			for _, m := range e.reg.mappings {
				if m.GetCapability() == tt.capability {
					m.IdempotencyKeyField, m.StatusTool = tt.key, tt.statusTool
				}
			}
			e.reg.mu.Unlock()
			// Carol publishes and bob authors: the default policy permits
			// each the capability it is asked about.
			requester := carol()
			if tt.capability == capPreview {
				requester = bob()
			}
			resp, err := e.client.Eligible(context.Background(), &policyv1.EligibleRequest{
				TaskId: "task_x", Requester: requester, Purpose: "export", NeededCapabilities: []string{tt.capability},
			})
			if err != nil {
				t.Fatal(err)
			}
			var c *policyv1.CapabilityEligibility
			for _, ce := range resp.GetCapabilities() {
				if ce.GetCapability() == tt.capability {
					c = ce
				}
			}
			got := c.GetStage() == policyv1.EligibilityStage_ELIGIBILITY_STAGE_OFFERED
			if got != tt.offered {
				t.Errorf("offered = %v (%v %v %q), want %v", got, c.GetStage(), c.GetReason(), c.GetDetail(), tt.offered)
			}
			if !tt.offered && (c.GetReason() != policyv1.NotOfferedReason_NOT_OFFERED_REASON_POLICY_DENIED ||
				!slices.Equal(c.GetPolicyReasons(), []string{tt.reason}) || !strings.Contains(c.GetDetail(), "declares neither an idempotency key field nor a status tool")) {
				t.Errorf("not offered as %v %v %q, want POLICY_DENIED by %s", c.GetReason(), c.GetPolicyReasons(), c.GetDetail(), tt.reason)
			}
		})
	}
}
