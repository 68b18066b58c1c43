package orchestrator

import (
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/grant"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/identity/identitytest"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/receipt"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// signed is a preview harness whose orchestrator has its certificate and
// whose fake adapter does what the real one does with grants: it verifies
// each grant against the request (refusing any other) and attests every OK
// result with the adapter's certificate.
type signed struct {
	*previewHarness
	adapterCreds, orchestratorCreds *identity.Credentials
	mu                              sync.Mutex
	grants                          []grant.Grant
}

func newSigned(t *testing.T) *signed {
	t.Helper()
	creds := identitytest.Credentials(t, identity.Adapter, identity.Orchestrator)
	s := &signed{adapterCreds: creds[0], orchestratorCreds: creds[1]}
	s.previewHarness = newPreviewHarness(t, func(d *Deps) { d.Credentials = s.orchestratorCreds })
	renderer := s.adapter.respond
	s.adapter.setRespond(func(in *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
		g, err := grant.Verify(s.adapterCreds, in.GetGrant(), time.Now())
		if err == nil {
			err = g.Match(in)
		}
		if err != nil {
			ge := err.(*grant.Error)
			return nil, apierror.New(codes.PermissionDenied, ge.Reason, ge.Msg, nil)
		}
		s.mu.Lock()
		s.grants = append(s.grants, g)
		s.mu.Unlock()
		resp, err := renderer(in)
		if err != nil || resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
			return resp, err
		}
		resp.ResponseDigest = "sha256:reply-" + in.GetAttemptId()
		artifact, delivery := receipt.Fields(resp.GetStructuredContent())
		resp.ReceiptAttestation, err = receipt.Attest(s.adapterCreds, receipt.Attestation{GrantID: g.ID, AttemptID: in.GetAttemptId(), IntentID: g.IntentID,
			TaskID: in.GetTaskId(), ResponseDigest: resp.GetResponseDigest(), ArtifactDigest: artifact, DeliveryID: delivery}, time.Now())
		return resp, err
	})
	return s
}

func (s *signed) seen() []grant.Grant {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]grant.Grant(nil), s.grants...)
}

// TestExecutionCarriesGrantAndAttestedReceipt: every adapter call carries
// a grant for exactly it, short-lived and bound to the intent and
// capability, and the receipt goes to evidence with the adapter's
// attestation.
func TestExecutionCarriesGrantAndAttestedReceipt(t *testing.T) {
	t.Parallel()
	h := newSigned(t)
	task := h.start(t, "preview", false).GetTask()
	r := h.submitPreview(t, task.GetId(), "call_1")
	done, err := h.approve(t, r.GetId())
	if err != nil || done.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("approve = %v, %v", done, err)
	}
	gs := h.seen()
	if len(gs) != 1 {
		t.Fatalf("grants = %+v", gs)
	}
	g := gs[0]
	life := time.Unix(g.ExpiresAt, 0).Sub(time.Unix(g.IssuedAt, 0))
	if g.IntentID != r.GetIntentId() || g.Capability != capRenderPreview || g.TaskID != task.GetId() || g.AttemptID != done.GetAttempts()[0].GetId() ||
		life != DefaultAttemptTimeout+grantMargin {
		t.Errorf("grant = %+v (lifetime %v)", g, life)
	}
	rc := h.evidence.receipts[r.GetIntentId()]
	if _, err := receipt.Check(h.orchestratorCreds, rc); err != nil || rc.GetArtifactDigest() != done.GetArtifactDigest() {
		t.Errorf("receipt %v: %v", rc, err)
	}
}

// TestUnattestedResultIsNoReceipt: an adapter reply claiming an artifact
// without the adapter's valid attestation of it commits nothing and
// records no receipt.
func TestUnattestedResultIsNoReceipt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		tamper func(s *signed, resp *adapterv1.ExecuteResponse)
		reason string
	}{
		{"no attestation", func(_ *signed, r *adapterv1.ExecuteResponse) { r.ReceiptAttestation = "" }, receipt.ReasonMissing},
		{"signed by the orchestrator", func(s *signed, r *adapterv1.ExecuteResponse) {
			r.ReceiptAttestation, _ = receipt.Attest(s.orchestratorCreds, receipt.Attestation{AttemptID: "att_x"}, time.Now())
		}, receipt.ReasonInvalid},
		{"artifact swapped after attestation", func(_ *signed, r *adapterv1.ExecuteResponse) {
			r.StructuredContent.Fields[receipt.FieldArtifactDigest] = r.StructuredContent.Fields["request_id"]
		}, receipt.ReasonMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newSigned(t)
			attested := h.adapter.respond
			h.adapter.setRespond(func(in *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
				resp, err := attested(in)
				if err == nil && resp.GetOutcome() == adapterv1.Outcome_OUTCOME_OK {
					tc.tamper(h, resp)
				}
				return resp, err
			})
			task := h.start(t, "preview", false).GetTask()
			r := h.submitPreview(t, task.GetId(), "call_1")
			got, err := h.approve(t, r.GetId())
			if err != nil || got.GetState() == orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || got.GetArtifactDigest() != "" {
				t.Fatalf("approve = %v, %v; want not executed", got, err)
			}
			if a := got.GetAttempts()[0]; a.GetOutcome() != adapterv1.Outcome_OUTCOME_UNKNOWN || a.GetError().GetSafeCode() != tc.reason {
				t.Errorf("attempt = %v, want UNKNOWN %s", a, tc.reason)
			}
			h.evidence.mu.Lock()
			defer h.evidence.mu.Unlock()
			if rc, ok := h.evidence.receipts[r.GetIntentId()]; ok {
				t.Errorf("receipt recorded: %v", rc)
			}
		})
	}
}

// TestForgedReceiptIsNeverTrusted plants receipts the adapter did not
// attest for the intent under its key (as if written past evidence's
// check), leaves the attempt open as a killed orchestrator does, and
// restarts: none of them settles the request, each leaves a DIAGNOSTIC in
// the trace, and the forged digest never becomes the request's.
func TestForgedReceiptIsNeverTrusted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		forge  func(s *signed, r *orchestratorv1.ToolRequest) *evidencev1.Receipt
		reason string
	}{
		{"no attestation", func(_ *signed, r *orchestratorv1.ToolRequest) *evidencev1.Receipt {
			return forgedReceipt(r, "att_open", "")
		}, receipt.ReasonMissing},
		{"attested by the orchestrator, not the adapter", func(s *signed, r *orchestratorv1.ToolRequest) *evidencev1.Receipt {
			return forgedReceipt(r, "att_open", attestFor(t, s.orchestratorCreds, r, "att_open"))
		}, receipt.ReasonInvalid},
		{"a genuine attestation of another intent", func(s *signed, r *orchestratorv1.ToolRequest) *evidencev1.Receipt {
			other := proto.CloneOf(r)
			other.IntentId = "int_other"
			return forgedReceipt(r, "att_open", attestFor(t, s.adapterCreds, other, "att_open"))
		}, receipt.ReasonMismatch},
		{"a genuine attestation naming an attempt the request never made", func(s *signed, r *orchestratorv1.ToolRequest) *evidencev1.Receipt {
			return forgedReceipt(r, "att_elsewhere", attestFor(t, s.adapterCreds, r, "att_elsewhere"))
		}, receipt.ReasonMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newSigned(t)
			task := h.start(t, "preview", false).GetTask()
			r := h.submitPreview(t, task.GetId(), "call_1")
			if _, err := h.server.st.UseApproval(t.Context(), r.GetId(), "bob", timestamppb.Now()); err != nil {
				t.Fatal(err)
			}
			if _, err := h.server.st.UpdateRequest(t.Context(), r.GetId(), func(x *orchestratorv1.ToolRequest) error {
				mergeAttempt(x, &orchestratorv1.Attempt{Id: "att_open", IntentId: x.GetIntentId(), Number: 1,
					Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_SENT, StartTime: timestamppb.Now()})
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			h.evidence.mu.Lock()
			h.evidence.receipts[r.GetIntentId()] = tc.forge(h, r)
			h.evidence.mu.Unlock()

			restarted := NewServer(h.server.st, h.server.deps, nil)
			defer restarted.Close()
			var got *orchestratorv1.ToolRequest
			if !testkit.Within(10*time.Second, func() bool {
				var err error
				if got, err = restarted.st.GetRequest(t.Context(), r.GetId()); err != nil {
					t.Fatal(err)
				}
				return got.GetState() == orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || got.GetState() == orchestratorv1.RequestState_REQUEST_STATE_FAILED
			}) {
				t.Fatalf("not recovered: %v", got)
			}
			if got.GetArtifactDigest() == forgedDigest || got.GetReceiptId() == "rcpt_forged" || got.GetState() == orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
				t.Errorf("request after restart = %v: a forged receipt settled it", got)
			}
			if !strings.Contains(got.GetAttempts()[0].GetResolution(), "receipt rcpt_forged ignored") {
				t.Errorf("resolution = %q", got.GetAttempts()[0].GetResolution())
			}
			var diag *evidencev1.ProductEvent
			for _, p := range h.evidence.product(task.GetId()) {
				if p.GetKind() == evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_DIAGNOSTIC && strings.Contains(p.GetDetail(), "rcpt_forged") {
					diag = p
				}
			}
			if diag.GetReason() != tc.reason || diag.GetRequestId() != r.GetId() {
				t.Errorf("diagnostic = %v, want reason %s", diag, tc.reason)
			}
		})
	}
}

const forgedDigest = "sha256:FORGED"

func forgedReceipt(r *orchestratorv1.ToolRequest, attempt, attestation string) *evidencev1.Receipt {
	return &evidencev1.Receipt{Id: "rcpt_forged", IdempotencyKey: r.GetIntentId(), TaskId: r.GetTaskId(), AttemptId: attempt,
		ArtifactDigest: forgedDigest, Attestation: attestation, RecordTime: timestamppb.Now()}
}

// attestFor signs, with signer, an attestation of the forged digest for r
// and attempt.
func attestFor(t *testing.T, signer *identity.Credentials, r *orchestratorv1.ToolRequest, attempt string) string {
	t.Helper()
	tok, err := receipt.Attest(signer, receipt.Attestation{GrantID: ids.New("grant"), AttemptID: attempt, IntentID: r.GetIntentId(),
		TaskID: r.GetTaskId(), ResponseDigest: "sha256:reply", ArtifactDigest: forgedDigest}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestResourceReadFollowsTheHandle: with a resource mapping, the read is
// of exactly the source the task's handle names; a mapping that reads a
// fixed URI refuses a handle naming another source before the adapter is
// called.
func TestResourceReadFollowsTheHandle(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		bindings []*registryv1.ArgumentBinding
		reason   string
		code     codes.Code
	}{
		{"handle bound: reads the handle's target", []*registryv1.ArgumentBinding{{RemoteField: "uri", ProductField: "source", FromHandle: true}}, "", codes.OK},
		{"fixed URI: a handle for another source is refused", nil, "HANDLE_TARGET_MISMATCH", codes.PermissionDenied},
		{"a value bound to a resource read is unusable", []*registryv1.ArgumentBinding{
			{RemoteField: "uri", ProductField: "source", FromHandle: true}, {RemoteField: "limit", ProductField: "max_passages"},
		}, "MAPPING_UNUSABLE", codes.FailedPrecondition},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.registry.mu.Lock()
			m := h.registry.mappings[capRetrieveAuthorizedSource]
			// The mapping's own URI is the other source in the task's scope.
			m.Target = &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_RESOURCE, Name: releaseNotes.GetUri()}
			m.ArgumentMap, m.Defaults = tc.bindings, nil
			h.registry.mu.Unlock()
			cat := h.start(t, "source_review", false).GetCatalogue()
			handle := handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())
			_, err := h.submit(t, cat.GetTaskId(), "call_1", capRetrieveAuthorizedSource, map[string]any{"source": handle, "max_passages": 2})
			if tc.code != codes.OK {
				wantErr(t, err, tc.code, tc.reason)
				if n := h.adapter.calls.Load(); n != 0 {
					t.Errorf("adapter called %d times", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			in := h.adapter.lastRequest()
			if in.GetTarget().GetKind() != registryv1.RemoteKind_REMOTE_KIND_RESOURCE || in.GetTarget().GetName() != migrationGuide.GetUri() ||
				len(in.GetArguments().GetFields()) != 0 {
				t.Errorf("adapter asked to read %v with arguments %v, want exactly %s", in.GetTarget(), in.GetArguments(), migrationGuide.GetUri())
			}
		})
	}
}

// TestCallTarget covers what a resource read may read, including the
// refusals no product schema lets a request reach today.
func TestCallTarget(t *testing.T) {
	t.Parallel()
	resource := func(bindings ...*registryv1.ArgumentBinding) *registryv1.Mapping {
		return &registryv1.Mapping{Id: "map_r", Revision: 1, ArgumentMap: bindings,
			Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_RESOURCE, Name: "note://fixed"}}
	}
	handle := func(field string) *registryv1.ArgumentBinding {
		return &registryv1.ArgumentBinding{RemoteField: "uri", ProductField: field, FromHandle: true}
	}
	tool := &registryv1.Mapping{Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search"}}
	defaulted := resource()
	defaulted.Defaults = mustStruct(t, map[string]any{"format": "markdown"})
	tests := []struct {
		name    string
		m       *registryv1.Mapping
		targets map[string]string
		want    string
		reason  string
	}{
		{"a tool is the reviewed tool", tool, map[string]string{"source": "note://a"}, "search", ""},
		{"bound handle", resource(handle("source")), map[string]string{"source": "note://a"}, "note://a", ""},
		{"bound handle missing", resource(handle("source")), nil, "", "HANDLE_REQUIRED"},
		{"two bound handles", resource(handle("source"), handle("other")), map[string]string{"source": "note://a", "other": "note://b"}, "", "MAPPING_UNUSABLE"},
		{"defaults on a read", defaulted, nil, "", "MAPPING_UNUSABLE"},
		{"fixed URI, no handle", resource(), nil, "note://fixed", ""},
		{"fixed URI, handle for it", resource(), map[string]string{"source": "note://fixed"}, "note://fixed", ""},
		{"fixed URI, handle for another source", resource(), map[string]string{"source": "note://a"}, "", "HANDLE_TARGET_MISMATCH"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := callTarget(tc.m, tc.targets)
			if apierror.Reason(err) != tc.reason || got.GetName() != tc.want {
				t.Errorf("callTarget = %v, %v; want %q, reason %q", got, err, tc.want, tc.reason)
			}
		})
	}
}

// A read asks the adapter for no receipt attestation (its result becomes
// an observation; no attestation of it is ever checked); an effect, whose
// receipt is believed only with one, never asks for none.
func TestOnlyEffectsAskForAReceiptAttestation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, profile, capability string
		args                      func(*orchestratorv1.OfferedCatalogue) map[string]any
		omit                      bool
	}{
		{"read", "source_review", capRetrieveAuthorizedSource, func(cat *orchestratorv1.OfferedCatalogue) map[string]any {
			return map[string]any{"source": handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())}
		}, true},
		{"effect", "preview", capRenderPreview, func(*orchestratorv1.OfferedCatalogue) map[string]any {
			return map[string]any{"document_revision": 3}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			cat := h.start(t, tc.profile, false).GetCatalogue()
			if _, err := h.submit(t, cat.GetTaskId(), "call_1", tc.capability, tc.args(cat)); err != nil {
				t.Fatal(err)
			}
			in := h.adapter.lastRequest()
			if in == nil || in.GetOmitReceiptAttestation() != tc.omit {
				t.Errorf("%s: the adapter was asked %v; want omit_receipt_attestation %t", tc.capability, in, tc.omit)
			}
		})
	}
}
