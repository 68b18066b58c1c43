package evidence

import (
	"context"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// CompareRevisions compares two observations of one source, typically the
// one a claim cites and a later (live) one: their revisions and digests,
// whether the content differs, and which passages changed. Observations of
// different sources cannot be compared.
func (s *Server) CompareRevisions(ctx context.Context, req *evidencev1.CompareRevisionsRequest) (*evidencev1.RevisionComparison, error) {
	if vs := required(nil, [2]string{"base_observation_id", req.GetBaseObservationId()}, [2]string{"other_observation_id", req.GetOtherObservationId()}); len(vs) > 0 {
		if err := s.requireTask(ctx, authz.TraceRead, ""); err != nil {
			return nil, err
		}
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "name the two observations to compare", vs...)
	}
	// Each observation is read as its own task's evidence.
	load := func(id string) (*evidencev1.SourceObservation, error) {
		return s.observationFor(ctx, authz.TraceRead, id, "compare revisions", "no observation has this id")
	}
	base, err := load(req.GetBaseObservationId())
	if err != nil {
		return nil, err
	}
	other, err := load(req.GetOtherObservationId())
	if err != nil {
		return nil, err
	}
	if base.GetConnectionId() != other.GetConnectionId() || base.GetResourceUri() != other.GetResourceUri() {
		return nil, apierror.New(codes.FailedPrecondition, "DIFFERENT_SOURCES",
			"the two observations are of different sources (connection and resource URI); only revisions of one source compare", nil)
	}
	out := &evidencev1.RevisionComparison{
		ConnectionId:        base.GetConnectionId(),
		ResourceUri:         base.GetResourceUri(),
		BaseRevisionId:      base.GetRevisionId(),
		BaseRevisionNumber:  base.GetRevisionNumber(),
		BaseContentDigest:   base.GetContentDigest(),
		OtherRevisionId:     other.GetRevisionId(),
		OtherRevisionNumber: other.GetRevisionNumber(),
		OtherContentDigest:  other.GetContentDigest(),
		Differs:             base.GetContentDigest() != other.GetContentDigest(),
	}
	otherText := map[string]string{}
	for _, p := range other.GetPassages() {
		otherText[p.GetPassageId()] = passageIdentity(p)
	}
	seen := map[string]bool{}
	for _, p := range base.GetPassages() {
		seen[p.GetPassageId()] = true
		t, ok := otherText[p.GetPassageId()]
		switch {
		case !ok:
			out.RemovedPassageIds = append(out.RemovedPassageIds, p.GetPassageId())
		case t != passageIdentity(p):
			out.ChangedPassageIds = append(out.ChangedPassageIds, p.GetPassageId())
		}
	}
	for _, p := range other.GetPassages() {
		if !seen[p.GetPassageId()] {
			out.AddedPassageIds = append(out.AddedPassageIds, p.GetPassageId())
		}
	}
	return out, nil
}

// passageIdentity is what a passage's content is compared by: its text
// digest when it has one (asset-backed), else its text.
func passageIdentity(p *evidencev1.Passage) string {
	if p.GetTextDigest() != "" {
		return p.GetTextDigest()
	}
	return "text:" + p.GetText()
}
