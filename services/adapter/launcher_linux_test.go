package adapter

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestLauncherNotWiredRefuses: in a binary whose main never asked
// IsSandboxLaunch, re-executing itself would run that main (or its tests)
// again instead of the launcher, so no local server starts there: the
// refusal says what the binary lacks. Not parallel: it changes what this
// test binary's TestMain set, and the parallel tests run only after it.
func TestLauncherNotWiredRefuses(t *testing.T) {
	if !launcherWired.Load() {
		t.Fatal("TestMain did not ask IsSandboxLaunch")
	}
	e := newEnvWith(t, slog.New(slog.DiscardHandler), func(d *Deps) { d.StdioRoots = append(d.StdioRoots, "/usr/bin/touch") })
	marker := filepath.Join(testkit.WritableDir(t), "started")
	conn := e.registry.add(&registryv1.Connection{DisplayName: "touch", Transport: &registryv1.Transport{
		Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: "/usr/bin/touch", Args: []string{marker}}},
	}})
	launcherWired.Store(false)
	defer launcherWired.Store(true)
	_, err := e.srv.Discover(testkit.AsService(context.Background(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if apierror.Reason(err) != CodeSandboxUnavailable || status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "IsSandboxLaunch") {
		t.Errorf("discover: %v, want FAILED_PRECONDITION %s naming IsSandboxLaunch", err, CodeSandboxUnavailable)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("the server ran (%v)", err)
	}
	// Wired again, the same connection starts.
	launcherWired.Store(true)
	if _, err := e.srv.Discover(testkit.AsService(context.Background(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()}); err == nil {
		t.Log("touch answered discovery") // it is no MCP server; what matters is that it ran
	}
	testkit.Eventually(t, "the server runs once the launcher is wired", func() bool { _, err := os.Stat(marker); return err == nil })
}
