package attack_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/testkit"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// registryRead is one registry read an attacker would use to map the
// installation.
type registryRead struct {
	name string
	call func(ctx context.Context) error
}

// registryReads are the reads of one connection's records: its
// configuration, revisions, snapshots, mappings and events.
func registryReads(c registryv1.RegistryServiceClient, r *rendererEnv) []registryRead {
	return []registryRead{
		{"GetConnection", func(ctx context.Context) error {
			_, err := c.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: r.conn.GetId()})
			return err
		}},
		{"ListConnections", func(ctx context.Context) error {
			l, err := c.ListConnections(ctx, &registryv1.ListConnectionsRequest{})
			if err == nil && len(l.GetConnections()) == 0 {
				return errEmpty
			}
			return err
		}},
		{"ListConfigRevisions", func(ctx context.Context) error {
			_, err := c.ListConfigRevisions(ctx, &registryv1.ListConfigRevisionsRequest{ConnectionId: r.conn.GetId()})
			return err
		}},
		{"GetSnapshot", func(ctx context.Context) error {
			_, err := c.GetSnapshot(ctx, &registryv1.GetSnapshotRequest{Id: r.mapping.GetSnapshotId()})
			return err
		}},
		{"ListSnapshots", func(ctx context.Context) error {
			_, err := c.ListSnapshots(ctx, &registryv1.ListSnapshotsRequest{ConnectionId: r.conn.GetId()})
			return err
		}},
		{"DiffSnapshots", func(ctx context.Context) error {
			_, err := c.DiffSnapshots(ctx, &registryv1.DiffSnapshotsRequest{BaseSnapshotId: r.mapping.GetSnapshotId(), TargetSnapshotId: r.mapping.GetSnapshotId()})
			return err
		}},
		{"GetMapping", func(ctx context.Context) error {
			_, err := c.GetMapping(ctx, &registryv1.GetMappingRequest{Id: r.mapping.GetId()})
			return err
		}},
		{"ListMappings", func(ctx context.Context) error {
			l, err := c.ListMappings(ctx, &registryv1.ListMappingsRequest{})
			if err == nil && len(l.GetMappings()) == 0 {
				return errEmpty
			}
			return err
		}},
		{"WatchEvents", func(ctx context.Context) error {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			st, err := c.WatchEvents(ctx, &registryv1.WatchEventsRequest{})
			if err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		}},
	}
}

var errEmpty = apierror.New(codes.NotFound, "DEPENDENCY_NOT_FOUND", "the list was empty", nil)

// TestReconnaissanceNeedsARole: a caller with a valid token in no group
// (or only in groups that do not manage, review or audit servers) used to
// list every connection's command, arguments, environment, owner,
// reviewer and credential reference, every config revision, snapshot and
// mapping. Now each read is refused with PERMISSION_DENIED and
// ROLE_NOT_GRANTED, and nothing of the connection is in the refusal; the
// platform, reviewers and auditors still read them all.
func TestReconnaissanceNeedsARole(t *testing.T) {
	t.Parallel()
	s := startServices(t)
	r := newRenderer(t, s, s.Clients, true)
	reads := registryReads(s.Registry, r)
	strangers := []person{
		{"nobody@example", nil},
		alice, // an author: starts tasks, installs nothing
		{"writer@apps", []string{"product-services"}},
		bob, // an approver decides requests in product terms
	}
	for _, p := range strangers {
		for _, rd := range reads {
			t.Run(p.ID+"/"+rd.name, func(t *testing.T) {
				err := rd.call(testkit.As(s, p))
				if !apierror.Is(err, codes.PermissionDenied, "ROLE_NOT_GRANTED") {
					t.Fatalf("%s by %s: %v, want PERMISSION_DENIED ROLE_NOT_GRANTED", rd.name, p.ID, err)
				}
				// The refusal names the action, not what it protects.
				if strings.Contains(err.Error(), v0m3Bin) || strings.Contains(err.Error(), "fixture-renderer") {
					t.Errorf("the refusal leaks the connection's command: %v", err)
				}
			})
		}
	}
	for _, p := range []person{ivan, rita, audrey} {
		for _, rd := range reads {
			t.Run(p.ID+"/"+rd.name, func(t *testing.T) {
				if err := rd.call(testkit.As(s, p)); err != nil {
					t.Fatalf("%s by %s: %v", rd.name, p.ID, err)
				}
			})
		}
	}
	// The declared product contracts stay readable to every caller: a
	// product service needs the profiles it starts tasks with.
	if l, err := s.Registry.ListTaskProfiles(testkit.As(s, person{"nobody@example", nil}), &registryv1.ListTaskProfilesRequest{}); err != nil || len(l.GetProfiles()) == 0 {
		t.Errorf("task profiles for a caller in no group: %v, %v", l, err)
	}
	// The refused reads changed nothing: one connection, one mapping.
	conns, err := s.Registry.ListConnections(testkit.As(s, audrey), &registryv1.ListConnectionsRequest{})
	if err != nil || len(conns.GetConnections()) != 1 {
		t.Fatalf("connections after the attack: %v, %v", conns, err)
	}
}
