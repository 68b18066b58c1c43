package adapter

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// refusedEverywhere runs Execute, Discover and Health on conn and checks
// each is refused with code, as FORBIDDEN at stage PREPARED or
// FAILED_PRECONDITION.
func refusedEverywhere(t *testing.T, e *env, conn *registryv1.Connection, code string) {
	t.Helper()
	resp := execute(t, e, call(t, conn, "whoami", map[string]any{}, nil))
	wantFailure(t, resp, adapterv1.Outcome_OUTCOME_FORBIDDEN, code)
	if resp.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED || resp.GetError().GetAdapterDetail() == "" {
		t.Errorf("refused call: stage %v, adapter detail %q; want PREPARED and a reason a person can act on", resp.GetStage(), resp.GetError().GetAdapterDetail())
	}
	ctx := testkit.AsService(context.Background(), identity.Operator)
	if _, err := e.srv.Discover(ctx, &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()}); !apierror.Is(err, codes.FailedPrecondition, code) {
		t.Errorf("Discover: %v, want FAILED_PRECONDITION %s", err, code)
	}
	if _, err := e.srv.Health(ctx, &adapterv1.HealthRequest{ConnectionId: conn.GetId()}); !apierror.Is(err, codes.FailedPrecondition, code) {
		t.Errorf("Health: %v, want FAILED_PRECONDITION %s", err, code)
	}
}

// TestRefusedEndpointGetsNoRequest: with loopback not allowed, a counting
// server on loopback receives nothing, whether the URL names the address
// (refused before dialing) or a name that resolves to it (refused at dial
// time, after DNS), and the credential is never sent.
func TestRefusedEndpointGetsNoRequest(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		http.Error(w, "counted", http.StatusTeapot)
	}))
	t.Cleanup(srv.Close)
	e := newEnvWith(t, slog.New(slog.DiscardHandler), func(d *Deps) { d.AllowLoopback = false })
	_, ref := e.plantSecret(t)
	port := srv.URL[strings.LastIndex(srv.URL, ":")+1:]
	for _, url := range []string{
		srv.URL + "/mcp",                          // a literal loopback address
		"http://localhost:" + port + "/mcp",       // a name resolving to loopback
		"http://[::ffff:127.0.0.1]:" + port + "/", // loopback in IPv6 clothing
	} {
		t.Run(url, func(t *testing.T) {
			conn := e.registry.add(&registryv1.Connection{CredentialRef: ref, Transport: &registryv1.Transport{
				Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: url}}}})
			refusedEverywhere(t, e, conn, CodeEndpointNotAllowed)
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the refused server received %d requests", n)
	}
	if r := e.policy.last(); r != nil {
		t.Errorf("a refused connection was reported to policy: %v", r)
	}
}

// TestMetadataEndpointsAlwaysRefused: even where loopback and private
// networks are allowed, metadata and link-local endpoints are refused.
func TestMetadataEndpointsAlwaysRefused(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, slog.New(slog.DiscardHandler), func(d *Deps) { d.AllowPrivateNetworks = true })
	for _, url := range []string{
		"http://169.254.169.254/latest/meta-data/",
		"http://metadata.google.internal/computeMetadata/v1/",
		"http://[fd00:ec2::254]/latest/meta-data/",
		"http://[fe80::1]:8080/mcp",
		"http://2852039166/",
	} {
		conn := e.httpConn(url)
		resp := execute(t, e, call(t, conn, "whoami", map[string]any{}, nil))
		wantFailure(t, resp, adapterv1.Outcome_OUTCOME_FORBIDDEN, CodeEndpointNotAllowed)
	}
}

// TestRefusedExecutableStartsNothing: commands outside the stdio roots,
// however they get there (a shell by path, a bare name, a symlink planted
// inside a root, the work directory), and loader variables, start no
// process: the marker file the command would create never appears.
func TestRefusedExecutableStartsNothing(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	var workDir string
	e := newEnvWith(t, slog.New(slog.DiscardHandler), func(d *Deps) {
		d.StdioRoots = append(d.StdioRoots, root)
		workDir = d.WorkDir
	})
	marker := filepath.Join(t.TempDir(), "started")
	script := "touch " + marker
	link := filepath.Join(root, "innocent")
	if err := os.Symlink("/bin/sh", link); err != nil {
		t.Fatal(err)
	}
	planted := filepath.Join(workDir, "planted")
	if err := os.MkdirAll(workDir, 0o700); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fixtureBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(planted, b, 0o755); err != nil {
		t.Fatal(err)
	}
	stdio := func(command string, env map[string]string, args ...string) *registryv1.Connection {
		return e.registry.add(&registryv1.Connection{Transport: &registryv1.Transport{Kind: &registryv1.Transport_Stdio{
			Stdio: &registryv1.StdioTransport{Command: command, Args: args, Env: env}}}})
	}
	cases := []struct {
		name string
		conn *registryv1.Connection
		code string
	}{
		{"a shell by path", stdio("/bin/sh", nil, "-c", script), CodeExecutableNotAllowed},
		{"a shell by bare name", stdio("sh", nil, "-c", script), CodeExecutableNotAllowed},
		{"a symlink in a root to a shell", stdio(link, nil, "-c", script), CodeExecutableNotAllowed},
		{"an executable in the work directory", stdio(planted, nil, "--transport", "stdio", "--call-log", marker), CodeExecutableNotAllowed},
		{"a relative path", stdio("../../bin/sh", nil, "-c", script), CodeExecutableNotAllowed},
		{"a loader variable on an allowed executable", stdio(fixtureBin, map[string]string{"LD_PRELOAD": "/nonexistent.so"}, "--transport", "stdio", "--call-log", marker), CodeEnvNotAllowed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			refusedEverywhere(t, e, tc.conn, tc.code)
		})
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("a refused command ran: %s exists (%v)", marker, err)
	}
	// The allowed executable itself still runs.
	if r := execute(t, e, call(t, e.stdioConn("--hostile"), "whoami", map[string]any{}, nil)); r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Errorf("the fixture under its root: %v", r)
	}
}
