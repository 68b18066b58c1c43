package registry_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/registry"
	"github.com/v0m3/v0m3/suite"
)

// TestDefinitionWritesNeedTheirRole runs the registry with the real
// policy service and its default Cedar policy: only the platform group
// (and the operator, a V0M3 service the access table admits) declares
// capabilities and task profiles. A refused write stores nothing and
// writes no event.
func TestDefinitionWritesNeedTheirRole(t *testing.T) {
	t.Parallel()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Services: []string{suite.Registry, suite.Policy}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := t.Context()
	reg := s.Registry
	deliver, err := reg.GetCapability(s.As(ctx, "alice", "authors"), &registryv1.GetCapabilityRequest{Name: "deliver_approved_artifact"})
	if err != nil {
		t.Fatalf("a person reads capabilities: %v", err)
	}
	changed := proto.CloneOf(deliver)
	changed.Description = "Deliver anything anywhere."
	newCap := searchNotes(t)
	profile := &registryv1.TaskProfile{Name: "notes_review", Needs: []*registryv1.ProfileNeed{{Capability: "retrieve_authorized_source"}}}

	for _, who := range []struct {
		name   string
		groups []string
	}{{"alice", []string{"authors"}}, {"rita", []string{"reviewers", "approvers"}}, {"nobody", nil}} {
		as := s.As(ctx, who.name, who.groups...)
		for op, call := range map[string]func() error{
			"create capability": func() error {
				_, err := reg.CreateCapability(as, &registryv1.CreateCapabilityRequest{Capability: newCap})
				return err
			},
			"update capability": func() error {
				_, err := reg.UpdateCapability(as, &registryv1.UpdateCapabilityRequest{Capability: changed})
				return err
			},
			"deprecate capability": func() error {
				_, err := reg.DeprecateCapability(as, &registryv1.DeprecateCapabilityRequest{Name: "deliver_approved_artifact", Reason: "x"})
				return err
			},
			"create profile": func() error {
				_, err := reg.CreateTaskProfile(as, &registryv1.CreateTaskProfileRequest{Profile: profile})
				return err
			},
			"update profile": func() error {
				_, err := reg.UpdateTaskProfile(as, &registryv1.UpdateTaskProfileRequest{Profile: &registryv1.TaskProfile{Name: "export"}})
				return err
			},
			"deprecate profile": func() error {
				_, err := reg.DeprecateTaskProfile(as, &registryv1.DeprecateTaskProfileRequest{Name: "export", Reason: "x"})
				return err
			},
		} {
			if err := call(); !apierror.Is(err, codes.PermissionDenied, "ROLE_NOT_GRANTED") {
				t.Errorf("%s (%v): %s = %v (reason %q), want PERMISSION_DENIED ROLE_NOT_GRANTED", who.name, who.groups, op, err, apierror.Reason(err))
			}
		}
	}
	// Without a token nobody gets as far as policy.
	if _, err := reg.CreateCapability(ctx, &registryv1.CreateCapabilityRequest{Capability: newCap}); !apierror.Is(err, codes.Unauthenticated, "CREDENTIALS_MISSING") {
		t.Errorf("anonymous create: %v", err)
	}
	platform := s.As(ctx, "ines", "platform")
	if got, _ := reg.GetCapability(platform, &registryv1.GetCapabilityRequest{Name: "deliver_approved_artifact"}); !proto.Equal(got, deliver) {
		t.Errorf("deliver_approved_artifact changed after refusals: %v", got)
	}
	if _, err := reg.GetCapability(platform, &registryv1.GetCapabilityRequest{Name: "search_notes"}); !apierror.Is(err, codes.NotFound, "CAPABILITY_UNKNOWN") {
		t.Errorf("refused create stored search_notes: %v", err)
	}
	if _, err := reg.GetTaskProfile(platform, &registryv1.GetTaskProfileRequest{Name: "notes_review"}); !apierror.Is(err, codes.NotFound, "PROFILE_UNKNOWN") {
		t.Errorf("refused create stored notes_review: %v", err)
	}
	if p, err := reg.GetTaskProfile(platform, &registryv1.GetTaskProfileRequest{Name: "export"}); err != nil || p.GetRevision() != 1 || p.GetState() != registryv1.DefinitionState_DEFINITION_STATE_ACTIVE {
		t.Errorf("export after refusals = %v, %v", p, err)
	}

	// The platform group may; the creator is who the token names.
	created, err := reg.CreateCapability(platform, &registryv1.CreateCapabilityRequest{Capability: newCap})
	if err != nil || created.GetCreatedBy() != "ines" {
		t.Fatalf("platform create = %v, %v", created, err)
	}
	// No refused write left an event: the first after the defaults' is
	// this one.
	caps, _ := registry.DefaultCapabilities()
	profiles, _ := registry.DefaultTaskProfiles()
	wctx, cancel := watchContext(t)
	defer cancel()
	stream, err := reg.WatchEvents(s.As(wctx, "ines", "platform"), &registryv1.WatchEventsRequest{AfterSequence: int64(len(caps) + len(profiles))})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := stream.Recv(); err != nil || ev.GetDefinition() != "search_notes" || ev.GetType() != registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CAPABILITY_REVISED {
		t.Errorf("first event after the defaults = %v, %v; want search_notes declared", ev, err)
	}
	cancel()
	p, err := reg.CreateTaskProfile(platform, &registryv1.CreateTaskProfileRequest{Profile: profile})
	if err != nil || p.GetCreatedBy() != "ines" {
		t.Fatalf("platform create profile = %v, %v", p, err)
	}
	// The operator applies definitions from Capability resources as
	// itself, admitted by the access table without a person's token.
	op, err := s.PeerClients(identity.Operator)
	if err != nil {
		t.Fatal(err)
	}
	next := searchNotes(t)
	next.ManagedBy = "kubernetes/notes/search-notes"
	next.Description += " Managed by Kubernetes."
	byOperator, err := op.Registry.UpdateCapability(ctx, &registryv1.UpdateCapabilityRequest{Capability: next})
	if err != nil || byOperator.GetRevision() != 2 || byOperator.GetCreatedBy() != identity.ServiceURI(identity.Operator) {
		t.Errorf("operator update = %v, %v", byOperator, err)
	}
}
