package attack_test

import (
	"context"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/suite"
)

// TestObservationsAreReadAsTheirTasksEvidence: an observation is read
// (GetObservation, CompareRevisions) as its task's evidence, like the
// task's trace: its requester reads it, an auditor reads it, another
// author is refused, and a guessed id gets the same refusal, so ids
// cannot be probed. Before, requesters could not read their own
// observations this way at all (the check named no task).
func TestObservationsAreReadAsTheirTasksEvidence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := suite.Start(ctx, suite.Config{DataDir: t.TempDir(),
		Reach: &suite.Reach{StdioRoots: []string{filepath.Dir(v0m3Bin)}, AllowLoopback: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	r, err := scenario.Run(ctx, s.Clients, scenario.Config{Transport: scenario.StdioFixture(v0m3Bin), As: s.As})
	if err != nil {
		t.Fatal(err)
	}
	auditor := s.As(ctx, scenario.Auditor.ID, scenario.Auditor.Groups...)
	obs := firstObservation(t, s, auditor, r.SourceTask.GetTask().GetId())

	read := func(who context.Context, id string) error {
		if _, err := s.Evidence.GetObservation(who, &evidencev1.GetObservationRequest{Id: id}); err != nil {
			return err
		}
		_, err := s.Evidence.CompareRevisions(who, &evidencev1.CompareRevisionsRequest{BaseObservationId: id, OtherObservationId: id})
		return err
	}
	for _, tc := range []struct {
		name string
		who  context.Context
		id   string
		ok   bool
	}{
		{"the task's requester", s.As(ctx, scenario.Alice.ID, scenario.Alice.Groups...), obs, true},
		{"an auditor", auditor, obs, true},
		{"another author", s.As(ctx, scenario.Bob.ID, scenario.Bob.Groups...), obs, false},
		{"another author guessing an id", s.As(ctx, scenario.Bob.ID, scenario.Bob.Groups...), "obs_guessed", false},
	} {
		err := read(tc.who, tc.id)
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v, want the observation", tc.name, err)
		case !tc.ok && !apierror.Is(err, codes.PermissionDenied, "ROLE_NOT_GRANTED"):
			t.Errorf("%s: %v, want PERMISSION_DENIED ROLE_NOT_GRANTED", tc.name, err)
		}
	}
}
