package evidence

import (
	"context"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/fitness"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// ValidateObservation applies the evidentiary rule (fitness.Assess)
// without storing anything.
func (s *Server) ValidateObservation(_ context.Context, req *evidencev1.ValidateObservationRequest) (*evidencev1.ObservationValidation, error) {
	if req.GetObservation() == nil {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "an observation is required", apierror.FieldViolation{Field: "observation", Description: "required"})
	}
	f := fitness.Assess(req.GetObservation())
	return &evidencev1.ObservationValidation{Fit: len(f) == 0, Findings: f}, nil
}
