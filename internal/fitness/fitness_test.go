package fitness_test

import (
	"errors"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/fitness"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
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
		{"unknown media", valid(func(o *evidencev1.SourceObservation) { o.MediaType = "application/x-thing" }), []string{fitness.FindingMediaTypeUnknown}},
		{"uri list", valid(func(o *evidencev1.SourceObservation) { o.MediaType = "text/uri-list" }), []string{fitness.FindingMediaTypeUnknown}},
		{"no snapshot", valid(func(o *evidencev1.SourceObservation) { o.SnapshotId = "" }), []string{fitness.FindingProvenanceIncomplete}},
		{"no mapping revision", valid(func(o *evidencev1.SourceObservation) { o.MappingRevision = 0 }), []string{fitness.FindingProvenanceIncomplete}},
		{"no request", valid(func(o *evidencev1.SourceObservation) { o.RequestId, o.RequestDigest = "", "" }), []string{fitness.FindingProvenanceIncomplete, fitness.FindingProvenanceIncomplete}},
		{"title em-dash url", valid(text("API migration guide — https://example.com/guide")), []string{fitness.FindingTitleAndLinkOnly}},
		{"title colon url", valid(text("Rate limits: https://example.com/limits")), []string{fitness.FindingTitleAndLinkOnly}},
		{"markdown link", valid(text("[Rate limits](https://example.com/limits)")), []string{fitness.FindingTitleAndLinkOnly}},
		{"bare url", valid(text("https://example.com/limits")), []string{fitness.FindingTitleAndLinkOnly}},
		{"text citing a url", valid(text("The limit applies per key.\n\nSee https://example.com/limits for details.")), nil},
		{"asset mismatch", valid(func(o *evidencev1.SourceObservation) { o.AssetDigest = contentDigest("other") }), []string{fitness.FindingAssetMismatch}},
		// Tool data is named by its call and may be JSON; a source may be
		// neither.
		{"tool data as json", valid(func(o *evidencev1.SourceObservation) {
			o.Kind, o.ResourceUri, o.MediaType = evidencev1.ObservationKind_OBSERVATION_KIND_TOOL_DATA, "v0m3-data:conn_v/tools/search/calls/ab", "application/json"
		}), nil},
		{"tool data as text", valid(func(o *evidencev1.SourceObservation) {
			o.Kind, o.ResourceUri = evidencev1.ObservationKind_OBSERVATION_KIND_TOOL_DATA, "v0m3-data:conn_v/tools/search/calls/ab#text"
		}), nil},
		{"json source", valid(func(o *evidencev1.SourceObservation) { o.MediaType = "application/json" }), []string{fitness.FindingMediaTypeUnknown}},
		{"source taking a data identity", valid(func(o *evidencev1.SourceObservation) { o.ResourceUri = "V0M3-DATA:conn_v/tools/search/calls/ab" }),
			[]string{fitness.FindingIdentityReserved}},
		{"tool data under a source URI", valid(func(o *evidencev1.SourceObservation) { o.Kind = evidencev1.ObservationKind_OBSERVATION_KIND_TOOL_DATA }),
			[]string{fitness.FindingIdentityReserved}},
		{"unknown kind", valid(func(o *evidencev1.SourceObservation) { o.Kind = evidencev1.ObservationKind(9) }), []string{fitness.FindingProvenanceIncomplete}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := findingCodes(fitness.Assess(tc.obs)); !slices.Equal(got, tc.want) {
				t.Errorf("Assess = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRefused: the refusal evidence sends reads back as the findings it
// names; another error, or another refusal, is not an unfit observation.
func TestRefused(t *testing.T) {
	t.Parallel()
	findings := fitness.Assess(observation("task_r", "conn_r", "", "Rate limits — https://example.com/limits"))
	if len(findings) < 2 {
		t.Fatalf("findings = %v, want at least two", findings)
	}
	code, summary, ok := fitness.Refused(fitness.Refusal(fitness.ReasonUnfit, "the observation cannot support a claim", findings))
	if !ok || code != findings[0].GetCode() || summary != fitness.Summary(findings) {
		t.Errorf("Refused = %q, %q, %v; want %q, %q, true", code, summary, ok, findings[0].GetCode(), fitness.Summary(findings))
	}
	for _, err := range []error{
		nil,
		errors.New("not a status"),
		fitness.Refusal("OBSERVATION_NOT_EVIDENCE", "a claim's observation", findings),
		apierror.New(codes.FailedPrecondition, fitness.ReasonUnfit, "no finding named", nil),
	} {
		if _, _, ok := fitness.Refused(err); ok {
			t.Errorf("Refused(%v) = true", err)
		}
	}
}

// contentDigest returns the digest of a piece of test content.
func contentDigest(content string) string { return digest.Bytes([]byte(content)) }

// observation returns a complete, fit observation for task and source.
func observation(task, conn, uri, content string) *evidencev1.SourceObservation {
	return &evidencev1.SourceObservation{
		ConnectionId:    conn,
		SnapshotId:      "snap_" + conn,
		MappingId:       "map_" + conn,
		MappingRevision: 1,
		RequestDigest:   contentDigest("args " + task),
		TaskId:          task,
		RequestId:       "att_" + task,
		ResourceUri:     uri,
		ContentDigest:   contentDigest(content),
		MediaType:       "text/markdown",
		SizeBytes:       int64(len(content)),
		Passages:        []*evidencev1.Passage{{PassageId: "p1", Text: content}},
	}
}
