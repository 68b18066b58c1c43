package evidence_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

func TestClaimStaysOnItsRevision(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const conn, uri = "conn_notes", "notes://qualification"

	old := record(t, e, observation("task_c", conn, uri, "The result holds for all inputs."))
	link, err := e.client.LinkClaim(t.Context(), &evidencev1.LinkClaimRequest{ClaimId: "claim_42", ObservationId: old.GetId(), PassageId: "p1"})
	if err != nil {
		t.Fatalf("LinkClaim: %v", err)
	}
	if link.GetId() == "" || link.GetRevisionId() != old.GetRevisionId() || link.GetPassageId() != "p1" ||
		link.GetClaimId() != "claim_42" || link.GetObservationId() != old.GetId() || !link.GetLinkTime().AsTime().Equal(t0) {
		t.Fatalf("link = %v, want claim_42 on observation %s revision %s passage p1 at %v", link, old.GetId(), old.GetRevisionId(), t0)
	}

	// The note's qualification changes while its URI stays the same.
	e.clock.Advance(1)
	changed := record(t, e, observation("task_c", conn, uri, "The result holds for positive inputs only."))
	if changed.GetRevisionNumber() != 2 {
		t.Fatalf("changed content: revision #%d, want 2", changed.GetRevisionNumber())
	}

	// The evidence the link points at still resolves to revision 1, and a
	// claim linked to the old observation now is still tied to revision 1,
	// not to the source's latest content.
	got, err := e.client.GetObservation(t.Context(), &evidencev1.GetObservationRequest{Id: link.GetObservationId()})
	if err != nil {
		t.Fatalf("GetObservation: %v", err)
	}
	if got.GetRevisionId() != link.GetRevisionId() || got.GetRevisionNumber() != 1 {
		t.Errorf("linked observation moved to revision %q #%d, want %q #1", got.GetRevisionId(), got.GetRevisionNumber(), link.GetRevisionId())
	}
	later, err := e.client.LinkClaim(t.Context(), &evidencev1.LinkClaimRequest{ClaimId: "claim_43", ObservationId: old.GetId()})
	if err != nil {
		t.Fatalf("LinkClaim after revision 2: %v", err)
	}
	if later.GetRevisionId() != old.GetRevisionId() {
		t.Errorf("claim on the old observation got revision %q, want revision 1 %q", later.GetRevisionId(), old.GetRevisionId())
	}
	if later.GetId() == link.GetId() {
		t.Errorf("two links share id %q", later.GetId())
	}
	onNew, err := e.client.LinkClaim(t.Context(), &evidencev1.LinkClaimRequest{ClaimId: "claim_44", ObservationId: changed.GetId()})
	if err != nil {
		t.Fatalf("LinkClaim on revision 2: %v", err)
	}
	if onNew.GetRevisionId() != changed.GetRevisionId() {
		t.Errorf("claim on the new observation got revision %q, want %q", onNew.GetRevisionId(), changed.GetRevisionId())
	}
}

func TestLinkClaimRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	withPassages := record(t, e, observation("task_l", "conn_l", "notes://l", "text"))
	bare := observation("task_l", "conn_l", "notes://bare", "text")
	bare.Passages = nil
	noPassages := record(t, e, bare)

	tests := []struct {
		name   string
		req    *evidencev1.LinkClaimRequest
		code   codes.Code
		reason string
		fields []string
	}{
		{"empty request", &evidencev1.LinkClaimRequest{}, codes.InvalidArgument, "CLAIM_LINK_INVALID", []string{"claim_id", "observation_id"}},
		{"no claim", &evidencev1.LinkClaimRequest{ObservationId: withPassages.GetId()}, codes.InvalidArgument, "CLAIM_LINK_INVALID", []string{"claim_id"}},
		{"unknown observation", &evidencev1.LinkClaimRequest{ClaimId: "c", ObservationId: "obs_nope"}, codes.NotFound, "OBSERVATION_UNKNOWN", nil},
		{"unknown passage", &evidencev1.LinkClaimRequest{ClaimId: "c", ObservationId: withPassages.GetId(), PassageId: "p9"}, codes.InvalidArgument, "PASSAGE_UNKNOWN", []string{"passage_id"}},
		{"passage on observation without passages", &evidencev1.LinkClaimRequest{ClaimId: "c", ObservationId: noPassages.GetId(), PassageId: "p1"}, codes.InvalidArgument, "PASSAGE_UNKNOWN", []string{"passage_id"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := e.client.LinkClaim(t.Context(), tc.req)
			wantError(t, err, tc.code, tc.reason, tc.fields...)
		})
	}
}
