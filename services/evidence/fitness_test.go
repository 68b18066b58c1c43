package evidence_test

import (
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/services/evidence"
	"github.com/v0m3/v0m3/services/internal/store"
)

func findingCodes(fs []*evidencev1.ValidationFinding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.GetCode())
	}
	return out
}

// TestAssess: what can support a claim and what stays a diagnostic.
func TestAssess(t *testing.T) {
	t.Parallel()
	valid := func(change func(o *evidencev1.SourceObservation)) *evidencev1.SourceObservation {
		o := observation("task_v", "conn_v", "notes://v", "The API allows 600 requests per minute.")
		change(o)
		return o
	}
	text := func(s string) func(o *evidencev1.SourceObservation) {
		return func(o *evidencev1.SourceObservation) {
			o.Passages = []*evidencev1.Passage{{PassageId: "p1", Text: s}}
			o.ContentDigest = contentDigest(s)
		}
	}
	tests := []struct {
		name string
		obs  *evidencev1.SourceObservation
		want []string
	}{
		{"markdown source", valid(func(*evidencev1.SourceObservation) {}), nil},
		{"plain text with parameters", valid(func(o *evidencev1.SourceObservation) { o.MediaType = "Text/Plain; charset=utf-8" }), nil},
		{"html", valid(func(o *evidencev1.SourceObservation) { o.MediaType = "text/html" }), nil},
		{"unknown media", valid(func(o *evidencev1.SourceObservation) { o.MediaType = "application/x-thing" }), []string{evidence.FindingMediaTypeUnknown}},
		{"uri list", valid(func(o *evidencev1.SourceObservation) { o.MediaType = "text/uri-list" }), []string{evidence.FindingMediaTypeUnknown}},
		{"no snapshot", valid(func(o *evidencev1.SourceObservation) { o.SnapshotId = "" }), []string{evidence.FindingProvenanceIncomplete}},
		{"no mapping revision", valid(func(o *evidencev1.SourceObservation) { o.MappingRevision = 0 }), []string{evidence.FindingProvenanceIncomplete}},
		{"no request", valid(func(o *evidencev1.SourceObservation) { o.RequestId, o.RequestDigest = "", "" }), []string{evidence.FindingProvenanceIncomplete, evidence.FindingProvenanceIncomplete}},
		{"title em-dash url", valid(text("API migration guide — https://example.com/guide")), []string{evidence.FindingTitleAndLinkOnly}},
		{"title colon url", valid(text("Rate limits: https://example.com/limits")), []string{evidence.FindingTitleAndLinkOnly}},
		{"markdown link", valid(text("[Rate limits](https://example.com/limits)")), []string{evidence.FindingTitleAndLinkOnly}},
		{"bare url", valid(text("https://example.com/limits")), []string{evidence.FindingTitleAndLinkOnly}},
		{"text citing a url", valid(text("The limit applies per key.\n\nSee https://example.com/limits for details.")), nil},
		{"asset mismatch", valid(func(o *evidencev1.SourceObservation) { o.AssetDigest = contentDigest("other") }), []string{evidence.FindingAssetMismatch}},
		// Tool data is named by its call and may be JSON; a source may be
		// neither.
		{"tool data as json", valid(func(o *evidencev1.SourceObservation) {
			o.Kind, o.ResourceUri, o.MediaType = evidencev1.ObservationKind_OBSERVATION_KIND_TOOL_DATA, "v0m3-data:conn_v/tools/search/calls/ab", "application/json"
		}), nil},
		{"tool data as text", valid(func(o *evidencev1.SourceObservation) {
			o.Kind, o.ResourceUri = evidencev1.ObservationKind_OBSERVATION_KIND_TOOL_DATA, "v0m3-data:conn_v/tools/search/calls/ab#text"
		}), nil},
		{"json source", valid(func(o *evidencev1.SourceObservation) { o.MediaType = "application/json" }), []string{evidence.FindingMediaTypeUnknown}},
		{"source taking a data identity", valid(func(o *evidencev1.SourceObservation) { o.ResourceUri = "V0M3-DATA:conn_v/tools/search/calls/ab" }),
			[]string{evidence.FindingIdentityReserved}},
		{"tool data under a source URI", valid(func(o *evidencev1.SourceObservation) { o.Kind = evidencev1.ObservationKind_OBSERVATION_KIND_TOOL_DATA }),
			[]string{evidence.FindingIdentityReserved}},
		{"unknown kind", valid(func(o *evidencev1.SourceObservation) { o.Kind = evidencev1.ObservationKind(9) }), []string{evidence.FindingProvenanceIncomplete}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := findingCodes(evidence.Assess(tc.obs)); !slices.Equal(got, tc.want) {
				t.Errorf("Assess = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestUnfitObservationIsNotRecorded: RecordObservation refuses what cannot
// support a claim, ValidateObservation says why without storing anything,
// and no revision appears for the source.
func TestUnfitObservationIsNotRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	o := observation("task_u", "conn_u", "notes://u", "Rate limits — https://example.com/limits")
	v, err := e.client.ValidateObservation(t.Context(), &evidencev1.ValidateObservationRequest{Observation: o})
	if err != nil || v.GetFit() || !slices.Equal(findingCodes(v.GetFindings()), []string{evidence.FindingTitleAndLinkOnly}) {
		t.Fatalf("ValidateObservation = %v, %v; want unfit TITLE_AND_LINK_ONLY", v, err)
	}
	_, err = e.client.RecordObservation(t.Context(), &evidencev1.RecordObservationRequest{Observation: o})
	wantError(t, err, codes.FailedPrecondition, "OBSERVATION_UNFIT")
	revs, err := e.client.ListRevisions(t.Context(), &evidencev1.ListRevisionsRequest{ConnectionId: "conn_u", ResourceUri: "notes://u"})
	if err != nil || len(revs.GetRevisions()) != 0 {
		t.Errorf("revisions after a refused observation = %v, %v", revs, err)
	}
	ok := observation("task_u", "conn_u", "notes://u", "The limit applies per API key.")
	if v, err := e.client.ValidateObservation(t.Context(), &evidencev1.ValidateObservationRequest{Observation: ok}); err != nil || !v.GetFit() {
		t.Errorf("ValidateObservation(fit) = %v, %v", v, err)
	}
}

// TestLinkClaimRefusesUnfitObservation: an unfit record that reached the
// store some other way (an older rule, a direct write) still cannot
// support a claim.
func TestLinkClaimRefusesUnfitObservation(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "evidence.db")
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	st := evidence.NewBoltStore(db)
	unfit := observation("task_c", "conn_c", "notes://c", "Rate limits — https://example.com/limits")
	unfit.Id, unfit.MediaType = "obs_legacy", "text/uri-list"
	if _, err := st.RecordObservation(t.Context(), unfit, "rev_legacy"); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	e := startEnv(t, path, &clock{t: t0})
	_, err = e.client.LinkClaim(t.Context(), &evidencev1.LinkClaimRequest{ClaimId: "claim_1", ObservationId: "obs_legacy", PassageId: "p1"})
	wantError(t, err, codes.FailedPrecondition, "OBSERVATION_NOT_EVIDENCE")
}
