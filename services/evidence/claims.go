package evidence

import (
	"context"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/fitness"
	"github.com/v0m3/v0m3/internal/ids"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// LinkClaim links a claim to the observation that supports it. The link
// records the observation's revision at link time and never moves: a later
// read of the same URI with new content makes a new revision, and the claim
// stays tied to the content it was assessed against.
//
// A claim link is a write to a task's evidence: policy decides it with the
// task's requester and actor (as the task recorded them when it started),
// so a product service links claims only to the evidence of a task it
// requested or acts for.
func (s *Server) LinkClaim(ctx context.Context, req *evidencev1.LinkClaimRequest) (*evidencev1.ClaimLink, error) {
	if vs := required(nil, [2]string{"claim_id", req.GetClaimId()}, [2]string{"observation_id", req.GetObservationId()}); len(vs) > 0 {
		return nil, apierror.InvalidArgument("CLAIM_LINK_INVALID", "a claim link needs a claim id and an observation id", vs...)
	}
	obs, err := s.observationFor(ctx, authz.ClaimLink, req.GetObservationId(), "link claim",
		"no observation has this id; record the observation before linking a claim to it")
	if err != nil {
		return nil, err
	}
	// Fitness is checked again at link time: a record made before the rule
	// (or under a looser one) must not become a claim's support.
	if findings := fitness.Assess(obs); len(findings) > 0 {
		return nil, fitness.Refusal("OBSERVATION_NOT_EVIDENCE", "observation "+obs.GetId()+" cannot support a claim", findings)
	}
	if pid := req.GetPassageId(); pid != "" && !hasPassage(obs, pid) {
		return nil, apierror.InvalidArgument("PASSAGE_UNKNOWN", "the observation has no passage with this id",
			apierror.FieldViolation{Field: "passage_id", Description: "not a passage of observation " + obs.GetId()})
	}
	link := &evidencev1.ClaimLink{
		Id:            ids.New("claim"),
		ClaimId:       req.GetClaimId(),
		ObservationId: obs.GetId(),
		RevisionId:    obs.GetRevisionId(),
		PassageId:     req.GetPassageId(),
		LinkTime:      s.timestamp(),
	}
	if err := s.st.CreateClaimLink(ctx, link); err != nil {
		return nil, s.storeError(ctx, err, "link claim", "", "", nil)
	}
	s.log.InfoContext(ctx, "claim linked", "link_id", link.GetId(), "claim_id", link.GetClaimId(),
		"observation_id", link.GetObservationId(), "revision_id", link.GetRevisionId())
	return link, nil
}

func hasPassage(obs *evidencev1.SourceObservation, id string) bool {
	for _, p := range obs.GetPassages() {
		if p.GetPassageId() == id {
			return true
		}
	}
	return false
}
