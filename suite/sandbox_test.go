package suite_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// TestAdapterRecordsItsSandbox: through the real access table, the
// adapter records on the connection the sandbox it applied to a local
// server it started (the registry's ReportSandbox), without a new config
// revision or another review.
func TestAdapterRecordsItsSandbox(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no true executable:", err)
	}
	if bin, err = filepath.EvalSymlinks(bin); err != nil {
		t.Fatal(err)
	}
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Reach: &suite.Reach{StdioRoots: []string{bin}, AllowLoopback: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := s.As(t.Context(), scenario.Integrator.ID, scenario.Integrator.Groups...)
	conn, err := s.Connect(ctx, &registryv1.CreateConnectionRequest{DisplayName: "Silent", Owner: "platform-team", Transport: scenario.StdioFixture(bin)})
	if err != nil {
		t.Fatal(err)
	}
	// true exits at once: discovery fails, but the server was started in
	// its sandbox first.
	_, _ = s.Adapter.Discover(ctx, &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	var got *registryv1.Connection
	testkit.Eventually(t, "the adapter's sandbox recorded on the connection", func() bool {
		got, err = s.Registry.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: conn.GetId()})
		return err == nil && got.GetSandbox() != nil
	})
	if got.GetSandbox().GetWorkingDir() == "" || !got.GetSandbox().GetMinimalEnvironment() {
		t.Errorf("recorded sandbox = %v", got.GetSandbox())
	}
	if got.GetConfigRevision() != conn.GetConfigRevision() || got.GetReviewState() != conn.GetReviewState() || got.GetConfigDigest() != conn.GetConfigDigest() {
		t.Errorf("recording the sandbox changed the configuration: revision %d→%d, review %v→%v",
			conn.GetConfigRevision(), got.GetConfigRevision(), conn.GetReviewState(), got.GetReviewState())
	}
}
