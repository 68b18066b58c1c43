package orchestrator

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/fitness"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// TestTitleAndLinkIsNotASource: a tool that answers with only a title and
// a URL (as text naming a resource, as a bare text block, or as structured
// {title,url}), or with a media type that is not evidence, completes the
// call but yields no source record and no excerpt: each item is a traced
// diagnostic with the finding's code. The orchestrator applies the rule
// itself, so such an item never reaches evidence; and an item evidence
// refuses as unfit by a rule the orchestrator does not know yet (version
// skew: evidence is the authority) is the same diagnostic, not an error.
func TestTitleAndLinkIsNotASource(t *testing.T) {
	t.Parallel()
	item := func(uri, mediaType, text string, i int32) *adapterv1.ContentItem {
		return &adapterv1.ContentItem{Uri: uri, MediaType: mediaType, Text: text, ContentDigest: digest.Bytes([]byte(text)), Index: i}
	}
	// A newer evidence rule that no longer takes HTML as a source.
	noHTML := func(o *evidencev1.SourceObservation) []*evidencev1.ValidationFinding {
		if o.GetMediaType() != "text/html" {
			return nil
		}
		return []*evidencev1.ValidationFinding{{Code: fitness.FindingMediaTypeUnknown, Field: "observation.media_type", Detail: "no longer evidence"}}
	}
	tests := []struct {
		name       string
		items      []*adapterv1.ContentItem
		structured map[string]any
		stricter   func(*evidencev1.SourceObservation) []*evidencev1.ValidationFinding
		reason     string
		// recorded is how many RecordObservation calls evidence serves:
		// none for what the orchestrator's own assessment already finds
		// unfit.
		recorded int
	}{
		{"title and link with a resource URI", []*adapterv1.ContentItem{item("note://guide", "text/markdown", "API migration guide — https://example.com/guide", 0)}, nil, nil, "TITLE_AND_LINK_ONLY", 0},
		{"markdown link", []*adapterv1.ContentItem{item("note://guide", "text/plain", "[API migration guide](https://example.com/guide)", 0)}, nil, nil, "TITLE_AND_LINK_ONLY", 0},
		{"bare text block", []*adapterv1.ContentItem{item("", "text/plain", "API migration guide — https://example.com/guide", 0)}, nil, nil, "PROVENANCE_INCOMPLETE", 0},
		{"structured title and url", nil, map[string]any{"title": "API migration guide", "url": "https://example.com/guide"}, nil, "STRUCTURED_CONTENT", 0},
		{"unknown media type", []*adapterv1.ContentItem{item("note://guide", "application/x-unknown", "some bytes", 0)}, nil, nil, "MEDIA_TYPE_UNKNOWN", 0},
		{"evidence refuses what the orchestrator found fit", []*adapterv1.ContentItem{item("note://guide", "text/html", "<p>The API allows 600 requests per minute.</p>", 0)}, nil, noHTML, "MEDIA_TYPE_UNKNOWN", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.evidence.mu.Lock()
			h.evidence.stricter = tc.stricter
			h.evidence.mu.Unlock()
			h.adapter.mu.Lock()
			h.adapter.respond = func(*adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
				var sc *structpb.Struct
				if tc.structured != nil {
					sc, _ = structpb.NewStruct(tc.structured)
				}
				return &adapterv1.ExecuteResponse{
					Outcome: adapterv1.Outcome_OUTCOME_OK, Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED,
					Items: tc.items, StructuredContent: sc, ResponseDigest: "sha256:resp", Method: "tools/call", ObserveTime: timestamppb.Now(),
				}, nil
			}
			h.adapter.mu.Unlock()
			cat := h.start(t, "source_review", false).GetCatalogue()
			handle := handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())
			r, err := h.submit(t, cat.GetTaskId(), "call_1", capRetrieveAuthorizedSource, map[string]any{"source": handle})
			if err != nil {
				t.Fatalf("submit: %v", err)
			}
			if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || len(r.GetExcerpts()) != 0 {
				t.Errorf("request %v with %d excerpts, want EXECUTED with none", r.GetState(), len(r.GetExcerpts()))
			}
			if obs := h.evidence.observationsOf(cat.GetTaskId()); len(obs) != 0 {
				t.Errorf("recorded %d observations from a non-source result: %v", len(obs), obs)
			}
			h.evidence.mu.Lock()
			recorded := h.evidence.recorded
			h.evidence.mu.Unlock()
			if recorded != tc.recorded {
				t.Errorf("RecordObservation called %d times, want %d", recorded, tc.recorded)
			}
			found := false
			for _, e := range h.evidence.product(cat.GetTaskId()) {
				if e.GetKind() == evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_DIAGNOSTIC && e.GetReason() == tc.reason && e.GetRequestId() == r.GetId() {
					found = true
				}
			}
			if !found {
				t.Errorf("no DIAGNOSTIC %s event for request %s", tc.reason, r.GetId())
			}
			// The product service reads the same diagnostic on the request.
			onRequest := false
			for _, d := range r.GetDiagnostics() {
				// An item's detail names its findings, whichever side
				// found them.
				if d.GetCode() == tc.reason && d.GetItem() != "" && (tc.items == nil || strings.HasPrefix(d.GetDetail(), tc.reason+" (")) {
					onRequest = true
				}
			}
			if !onRequest {
				t.Errorf("request diagnostics %v lack %s", r.GetDiagnostics(), tc.reason)
			}
		})
	}
}
