package evidence_test

import (
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/fitness"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/services/evidence"
)

func findingCodes(fs []*evidencev1.ValidationFinding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.GetCode())
	}
	return out
}

// TestUnfitObservationIsNotRecorded: RecordObservation refuses what cannot
// support a claim, ValidateObservation says why without storing anything,
// and no revision appears for the source.
func TestUnfitObservationIsNotRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	o := observation("task_u", "conn_u", "notes://u", "Rate limits — https://example.com/limits")
	v, err := e.client.ValidateObservation(t.Context(), &evidencev1.ValidateObservationRequest{Observation: o})
	if err != nil || v.GetFit() || !slices.Equal(findingCodes(v.GetFindings()), []string{fitness.FindingTitleAndLinkOnly}) {
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
	e := startEnv(t, path, testkit.NewClock(t0))
	_, err = e.client.LinkClaim(t.Context(), &evidencev1.LinkClaimRequest{ClaimId: "claim_1", ObservationId: "obs_legacy", PassageId: "p1"})
	wantError(t, err, codes.FailedPrecondition, "OBSERVATION_NOT_EVIDENCE")
}
