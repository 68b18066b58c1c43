package evidence_test

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// TestCompareRevisions: a claim cites revision 1; the live read is
// revision 2 of the same URI. The comparison shows both digests, that they
// differ and which passage changed; the claim stays on revision 1.
func TestCompareRevisions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	mk := func(task, second string) *evidencev1.SourceObservation {
		o := observation(task, "conn_r", "notes://rate-limits", "# Rate limits\n\n"+second)
		o.Passages = []*evidencev1.Passage{{PassageId: "p1", Text: "# Rate limits"}, {PassageId: "p2", Text: second, Index: 1}}
		return o
	}
	old := record(t, e, mk("task_1", "The limit applies per API key."))
	link, err := e.client.LinkClaim(t.Context(), &evidencev1.LinkClaimRequest{ClaimId: "claim_rl", ObservationId: old.GetId(), PassageId: "p2"})
	if err != nil {
		t.Fatal(err)
	}
	live := record(t, e, mk("task_2", "The limit applies per organization, not per key."))
	if live.GetRevisionNumber() != 2 || live.GetRevisionId() == old.GetRevisionId() {
		t.Fatalf("live read joined revision %d (%s), want a new revision 2", live.GetRevisionNumber(), live.GetRevisionId())
	}
	cmp, err := e.client.CompareRevisions(t.Context(), &evidencev1.CompareRevisionsRequest{BaseObservationId: link.GetObservationId(), OtherObservationId: live.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if !cmp.GetDiffers() || cmp.GetBaseRevisionId() != link.GetRevisionId() || cmp.GetOtherRevisionNumber() != 2 ||
		cmp.GetBaseContentDigest() != old.GetContentDigest() || cmp.GetOtherContentDigest() != live.GetContentDigest() ||
		!slices.Equal(cmp.GetChangedPassageIds(), []string{"p2"}) || len(cmp.GetAddedPassageIds())+len(cmp.GetRemovedPassageIds()) != 0 {
		t.Errorf("comparison = %v", cmp)
	}
	same, err := e.client.CompareRevisions(t.Context(), &evidencev1.CompareRevisionsRequest{BaseObservationId: old.GetId(), OtherObservationId: old.GetId()})
	if err != nil || same.GetDiffers() || len(same.GetChangedPassageIds()) != 0 {
		t.Errorf("self comparison = %v, %v", same, err)
	}
	other := record(t, e, observation("task_3", "conn_r", "notes://other", "text"))
	_, err = e.client.CompareRevisions(t.Context(), &evidencev1.CompareRevisionsRequest{BaseObservationId: old.GetId(), OtherObservationId: other.GetId()})
	wantError(t, err, codes.FailedPrecondition, "DIFFERENT_SOURCES")
}
