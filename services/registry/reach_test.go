package registry_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/reach"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/registry"
)

// leakedValue is a literal secret an operator pasted into a connection's
// environment. It must appear in no error.
const leakedValue = "ghp_Zk3q9VxLr2m8Tn4Yb7Wc1Pd6Hs0Jf5Ga2Eu9"

func stdioWithArgs(cmd string, args ...string) *registryv1.Transport {
	return &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: cmd, Args: args}}}
}

func stdioWithEnv(cmd string, env map[string]string) *registryv1.Transport {
	return &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: cmd, Env: env}}}
}

// refusedConfigs are configurations every registry refuses, whatever its
// reachability policy, with the reason and field a person acts on.
var refusedConfigs = []struct {
	name      string
	transport *registryv1.Transport
	reason    string
	field     string
}{
	{"metadata address", httpTransport("http://169.254.169.254/latest/meta-data/"), reach.ReasonEndpoint, "transport.streamable_http.url"},
	{"metadata address in decimal", httpTransport("http://2852039166/"), reach.ReasonEndpoint, "transport.streamable_http.url"},
	{"metadata address IPv4-mapped", httpTransport("http://[::ffff:169.254.169.254]/"), reach.ReasonEndpoint, "transport.streamable_http.url"},
	{"AWS IPv6 metadata address", httpTransport("http://[fd00:ec2::254]/latest"), reach.ReasonEndpoint, "transport.streamable_http.url"},
	{"metadata name", httpTransport("http://metadata.google.internal/computeMetadata/v1/"), reach.ReasonEndpoint, "transport.streamable_http.url"},
	{"link-local", httpTransport("http://169.254.10.20:8080/mcp"), reach.ReasonEndpoint, "transport.streamable_http.url"},
	{"IPv6 link-local", httpTransport("http://[fe80::1%25eth0]:8080/mcp"), reach.ReasonEndpoint, "transport.streamable_http.url"},
	{"unspecified address", httpTransport("http://0.0.0.0:8080/mcp"), reach.ReasonEndpoint, "transport.streamable_http.url"},
	{"secret under a secret-looking name", stdioWithEnv("v0m3-server", map[string]string{"LOG_LEVEL": "info", "GITHUB_TOKEN": leakedValue}), registry.ReasonSecretInEnv, "transport.stdio.env"},
	{"secret-looking value under any name", stdioWithEnv("v0m3-server", map[string]string{"UPSTREAM": leakedValue}), registry.ReasonSecretInEnv, "transport.stdio.env"},
	{"URL with a password", stdioWithEnv("v0m3-server", map[string]string{"DATABASE_URL": "postgres://app:" + leakedValue + "@db/app"}), registry.ReasonSecretInEnv, "transport.stdio.env"},
	// Arguments are visible to every process on the host: the same rule.
	{"secret after a secret-looking option", stdioWithArgs("v0m3-server", "--transport", "stdio", "--token", leakedValue), registry.ReasonSecretInArgs, "transport.stdio.args[3]"},
	{"secret in an option=value argument", stdioWithArgs("v0m3-server", "--api-key="+leakedValue), registry.ReasonSecretInArgs, "transport.stdio.args[0]"},
	{"secret-looking argument", stdioWithArgs("v0m3-server", "serve", leakedValue), registry.ReasonSecretInArgs, "transport.stdio.args[1]"},
	{"authorization header argument", stdioWithArgs("v0m3-server", "--header", "Authorization: Bearer "+leakedValue), registry.ReasonSecretInArgs, "transport.stdio.args[1]"},
	{"relative executable", stdioTransport("./server"), reach.ReasonExecutable, "transport.stdio.command"},
	{"loader variable", stdioWithEnv("v0m3-server", map[string]string{"LD_PRELOAD": "/tmp/x.so"}), reach.ReasonEnv, "transport.stdio.env"},
}

// TestRefusedConfigurationsLeaveNothing: each refused configuration is
// INVALID_ARGUMENT with its reason, echoes no secret, and no connection,
// revision or event is recorded, on create and on update.
func TestRefusedConfigurationsLeaveNothing(t *testing.T) {
	t.Parallel()
	r := start(t)
	ctx := t.Context()
	for _, tt := range refusedConfigs {
		_, err := r.client.CreateConnection(ctx, &registryv1.CreateConnectionRequest{DisplayName: "S", Owner: "o", Transport: tt.transport})
		checkRefusal(t, "create "+tt.name, err, tt.reason, tt.field)
	}
	all, err := r.client.ListConnections(ctx, &registryv1.ListConnectionsRequest{IncludeRetired: true})
	if err != nil || len(all.GetConnections()) != 0 {
		t.Fatalf("after refused creates: %v connections, %v", len(all.GetConnections()), err)
	}

	good, err := r.client.CreateConnection(ctx, &registryv1.CreateConnectionRequest{DisplayName: "S", Owner: "o",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: "v0m3-server",
			Env:  map[string]string{"LOG_LEVEL": "info", "GOOGLE_APPLICATION_CREDENTIALS": "/var/run/secrets/sa.json"},
			Args: []string{"--transport", "stdio", "--token-file", "/var/run/secrets/token"}}}}})
	if err != nil {
		t.Fatalf("a clean configuration (a credential file path is not a secret): %v", err)
	}
	// The first event is the clean connection's: no refused attempt
	// wrote one.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	stream, err := r.client.WatchEvents(wctx, &registryv1.WatchEventsRequest{AfterSequence: r.base})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := stream.Recv()
	cancel()
	if err != nil || ev.GetSequence() != r.base+1 || ev.GetConnectionId() != good.GetId() {
		t.Fatalf("first event = %v, %v; want the clean connection's creation at sequence %d", ev, err, r.base+1)
	}

	for _, tt := range refusedConfigs {
		_, err := r.client.UpdateConnection(ctx, &registryv1.UpdateConnectionRequest{Id: good.GetId(), ExpectedConfigRevision: 1, Transport: tt.transport})
		checkRefusal(t, "update "+tt.name, err, tt.reason, tt.field)
	}
	got, err := r.client.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: good.GetId()})
	if err != nil || !proto.Equal(got, good) {
		t.Errorf("connection after refused updates = %v, %v; want it unchanged", got, err)
	}
	revs, err := r.client.ListConfigRevisions(ctx, &registryv1.ListConfigRevisionsRequest{ConnectionId: good.GetId()})
	if err != nil || len(revs.GetRevisions()) != 1 {
		t.Errorf("revisions after refused updates: %d, %v", len(revs.GetRevisions()), err)
	}
}

func checkRefusal(t *testing.T, what string, err error, reason, field string) {
	t.Helper()
	if !apierror.Is(err, codes.InvalidArgument, reason) {
		t.Errorf("%s: %v (reason %q), want INVALID_ARGUMENT %s", what, err, apierror.Reason(err), reason)
		return
	}
	if !slices.Contains(apierror.Fields(err), field) {
		t.Errorf("%s: violations %v lack %s", what, apierror.Fields(err), field)
	}
	if strings.Contains(err.Error(), leakedValue) || strings.Contains(err.Error(), "Zk3q9V") {
		t.Errorf("%s: the error echoes the secret: %v", what, err)
	}
	if (reason == registry.ReasonSecretInEnv || reason == registry.ReasonSecretInArgs) && !strings.Contains(err.Error(), "credential_ref") {
		t.Errorf("%s: the error does not point to credential_ref: %v", what, err)
	}
}

// TestReachPolicyInRegistry: a registry configured with the platform's
// policy refuses early what the adapter would refuse: loopback and private
// literals when not allowed, executables outside the stdio roots.
func TestReachPolicyInRegistry(t *testing.T) {
	t.Parallel()
	roots := t.TempDir()
	inside := filepath.Join(roots, "server")
	if err := os.WriteFile(inside, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	strict := startWith(t, filepath.Join(t.TempDir(), "registry.db"), func(s *registry.Server) *registry.Server {
		return s.WithReach(reach.Policy{StdioRoots: []string{roots}})
	})
	dev := start(t)
	tests := []struct {
		name      string
		transport *registryv1.Transport
		strictOK  bool
		devOK     bool
		reason    string
	}{
		{"loopback literal", httpTransport("http://127.0.0.1:8080/mcp"), false, true, reach.ReasonEndpoint},
		{"private literal", httpTransport("http://10.0.0.7:8080/mcp"), false, true, reach.ReasonEndpoint},
		{"service name", httpTransport("http://sources.mcp.svc:8080/mcp"), true, true, ""},
		{"executable under a root", stdioTransport(inside), true, true, ""},
		{"a shell", stdioTransport("/bin/sh"), false, true, reach.ReasonExecutable},
		{"a bare name (decided by the adapter)", stdioTransport("sh"), true, true, ""},
	}
	for _, tt := range tests {
		for _, c := range []struct {
			name string
			r    *running
			ok   bool
		}{{"strict", strict, tt.strictOK}, {"default", dev, tt.devOK}} {
			_, err := c.r.client.CreateConnection(t.Context(), &registryv1.CreateConnectionRequest{DisplayName: "S", Owner: "o", Transport: tt.transport})
			if c.ok {
				if err != nil {
					t.Errorf("%s registry, %s: %v", c.name, tt.name, err)
				}
				continue
			}
			if !apierror.Is(err, codes.InvalidArgument, tt.reason) {
				t.Errorf("%s registry, %s: %v, want %s", c.name, tt.name, err, tt.reason)
			}
		}
	}
}
