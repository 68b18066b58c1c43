package registry_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// TestReportSandboxAdapterOnly: the sandbox a connection records is the
// adapter's observation. Through the real access guard, every other
// caller (a person, an administrator, each other V0M3 service, nobody) is
// refused ReportSandbox with PERMISSION_DENIED and the connection stays
// as it was; the adapter records the sandbox and nothing else (no new
// config revision, the same configuration and review state), only at the
// revision it read; and the adapter may no longer call UpdateConnection.
func TestReportSandboxAdapterOnly(t *testing.T) {
	t.Parallel()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Services: []string{suite.Registry, suite.Policy}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := t.Context()
	platform := s.As(ctx, "ines", "platform")
	created, err := s.Connect(platform, &registryv1.CreateConnectionRequest{DisplayName: "Notes", Owner: "platform-team", Transport: httpTransport("https://notes.example/mcp")})
	if err != nil {
		t.Fatal(err)
	}
	read := func() *registryv1.Connection {
		t.Helper()
		c, err := s.Registry.GetConnection(platform, &registryv1.GetConnectionRequest{Id: created.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	revisions := func() int {
		t.Helper()
		l, err := s.Registry.ListConfigRevisions(platform, &registryv1.ListConfigRevisionsRequest{ConnectionId: created.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.GetRevisions())
	}
	before, beforeRevisions := read(), revisions()
	forged := &registryv1.ReportSandboxRequest{ConnectionId: before.GetId(), ConfigRevision: before.GetConfigRevision(),
		Sandbox: &registryv1.SandboxConstraints{WorkingDir: "/", Network: registryv1.NetworkIsolation_NETWORK_ISOLATION_ENFORCED,
			Identity: &registryv1.SandboxIdentity{Kind: registryv1.IdentityKind_IDENTITY_KIND_DEDICATED_UID, Uid: 4242}}}

	type caller struct {
		name string
		call func() error
	}
	var callers []caller
	for _, who := range []struct {
		name   string
		groups []string
	}{{"alice", []string{"authors"}}, {"ines", []string{"platform"}}, {"rita", []string{"reviewers", "approvers"}}, {"root", []string{"platform", "reviewers", "auditors", "approvers"}}} {
		as := s.As(ctx, who.name, who.groups...)
		callers = append(callers, caller{"person " + who.name, func() error { _, err := s.Registry.ReportSandbox(as, forged); return err }})
	}
	callers = append(callers, caller{"anonymous", func() error { _, err := s.Registry.ReportSandbox(ctx, forged); return err }})
	for _, peer := range []string{identity.Orchestrator, identity.Operator, identity.Policy, identity.Evidence} {
		pc, err := s.PeerClients(peer)
		if err != nil {
			t.Fatal(err)
		}
		callers = append(callers, caller{"the " + peer + " service", func() error { _, err := pc.Registry.ReportSandbox(ctx, forged); return err }})
	}
	for _, c := range callers {
		if err := c.call(); apierror.Code(err) != codes.PermissionDenied {
			t.Errorf("%s reported a sandbox: %v, want PERMISSION_DENIED", c.name, err)
		}
	}
	if after := read(); !proto.Equal(after, before) {
		t.Errorf("refused reports changed the connection:\nbefore %v\nafter  %v", before, after)
	}

	adapter, err := s.PeerClients(identity.Adapter)
	if err != nil {
		t.Fatal(err)
	}
	// The adapter may no longer write the connection through the
	// administrators' call, not even its sandbox: its certificate is not
	// admitted there, and it holds no person's token.
	if _, err := adapter.Registry.UpdateConnection(ctx, &registryv1.UpdateConnectionRequest{Id: before.GetId(), ExpectedConfigRevision: before.GetConfigRevision(),
		Sandbox: forged.GetSandbox(), DisplayName: "taken over"}); !apierror.Is(err, codes.Unauthenticated, "CREDENTIALS_MISSING") {
		t.Errorf("adapter UpdateConnection: %v, want UNAUTHENTICATED CREDENTIALS_MISSING (the adapter's certificate is not admitted)", err)
	}
	// A report at a revision the connection has left changes nothing.
	stale := proto.CloneOf(forged)
	stale.ConfigRevision = before.GetConfigRevision() + 1
	if _, err := adapter.Registry.ReportSandbox(ctx, stale); !apierror.Is(err, codes.Aborted, "CONFIG_REVISION_CONFLICT") {
		t.Errorf("stale report: %v, want ABORTED CONFIG_REVISION_CONFLICT", err)
	}
	if _, err := adapter.Registry.ReportSandbox(ctx, &registryv1.ReportSandboxRequest{ConnectionId: before.GetId(), ConfigRevision: before.GetConfigRevision()}); !apierror.Is(err, codes.InvalidArgument, "FIELD_REQUIRED") {
		t.Errorf("report without a sandbox: %v, want INVALID_ARGUMENT FIELD_REQUIRED", err)
	}
	if after := read(); !proto.Equal(after, before) {
		t.Errorf("refused adapter calls changed the connection:\nbefore %v\nafter  %v", before, after)
	}

	got, err := adapter.Registry.ReportSandbox(ctx, forged)
	if err != nil {
		t.Fatalf("adapter report: %v", err)
	}
	after := read()
	if !proto.Equal(after.GetSandbox(), forged.GetSandbox()) || !proto.Equal(got.GetSandbox(), forged.GetSandbox()) {
		t.Errorf("recorded sandbox %v, want %v", after.GetSandbox(), forged.GetSandbox())
	}
	// Everything but the sandbox and the update time is as it was.
	want := proto.CloneOf(before)
	want.Sandbox, want.UpdateTime = after.GetSandbox(), after.GetUpdateTime()
	if !proto.Equal(after, want) {
		t.Errorf("the report changed more than the sandbox:\nbefore %v\nafter  %v", before, after)
	}
	if n := revisions(); n != beforeRevisions {
		t.Errorf("%d config revisions after the report, want %d", n, beforeRevisions)
	}
}
