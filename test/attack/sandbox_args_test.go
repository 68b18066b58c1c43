package attack_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// TestSecretInArgumentsIsRefused plays a platform member who, refused a
// secret in a stdio server's environment, moves it into the server's
// command-line arguments, where every process on the host can read it
// (/proc/<pid>/cmdline). The registry refuses it as it refuses the
// environment, on create and on update, never echoes it, and stores
// nothing.
func TestSecretInArgumentsIsRefused(t *testing.T) {
	t.Parallel()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Reach: &suite.Reach{StdioRoots: []string{}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	platform := s.As(context.Background(), "ines", "platform")
	const secret = "ghp_0123456789abcdefghijABCDEFGHIJ012345"
	stdio := func(args ...string) *registryv1.Transport {
		return &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: "/usr/bin/env", Args: args}}}
	}
	cases := []struct {
		name      string
		transport *registryv1.Transport
	}{
		{"option then value", stdio("--token", secret)},
		{"option=value", stdio("--github-token=" + secret)},
		{"bare token", stdio("serve", secret)},
		{"header", stdio("--header", "Authorization: Bearer "+secret)},
	}
	refused := func(what string, err error) {
		t.Helper()
		if !apierror.Is(err, codes.InvalidArgument, "SECRET_IN_ARGS") {
			t.Errorf("%s: %v, want INVALID_ARGUMENT SECRET_IN_ARGS", what, err)
		}
		if err != nil && strings.Contains(err.Error(), secret[4:20]) {
			t.Errorf("%s: the refusal echoes the secret", what)
		}
	}
	for _, tc := range cases {
		_, err := s.Registry.CreateConnection(platform, &registryv1.CreateConnectionRequest{DisplayName: tc.name, Owner: "ines", Transport: tc.transport})
		refused("create "+tc.name, err)
	}
	list, err := s.Registry.ListConnections(platform, &registryv1.ListConnectionsRequest{IncludeRetired: true})
	if err != nil || len(list.GetConnections()) != 0 {
		t.Fatalf("connections after refusals: %v, %v", list, err)
	}

	// Nor can a clean connection be updated to carry one.
	clean, err := s.Registry.CreateConnection(platform, &registryv1.CreateConnectionRequest{DisplayName: "clean", Owner: "ines",
		Transport: stdio("--token-file", "/var/run/secrets/token")})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		_, err := s.Registry.UpdateConnection(platform, &registryv1.UpdateConnectionRequest{Id: clean.GetId(), ExpectedConfigRevision: clean.GetConfigRevision(), Transport: tc.transport})
		refused("update "+tc.name, err)
	}
	revs, err := s.Registry.ListConfigRevisions(platform, &registryv1.ListConfigRevisionsRequest{ConnectionId: clean.GetId()})
	if err != nil || len(revs.GetRevisions()) != 1 {
		t.Errorf("revisions after refused updates: %d, %v", len(revs.GetRevisions()), err)
	}
}
