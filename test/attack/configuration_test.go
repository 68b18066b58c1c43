package attack_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// TestDangerousConfigurationsAreRefused plays a platform member with the
// role to create connections who points one at the cloud metadata address
// or writes a secret into a stdio server's environment: the registry
// refuses each, names the field, never echoes the secret, and stores
// nothing. A loopback endpoint, which this deployment does not allow, gets
// no request even once created.
func TestDangerousConfigurationsAreRefused(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	loop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	t.Cleanup(loop.Close)
	// A deployment: loopback and private addresses are not configured.
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Reach: &suite.Reach{StdioRoots: []string{}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	platform := s.As(context.Background(), "ines", "platform")
	const secret = "ghp_0123456789abcdefghijABCDEFGHIJ012345"
	for _, tc := range []struct {
		name      string
		transport *registryv1.Transport
		reason    string
	}{
		{"metadata address", &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: "http://169.254.169.254/latest/meta-data/"}}}, "ENDPOINT_NOT_ALLOWED"},
		{"metadata name", &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: "http://metadata.google.internal/computeMetadata/v1/"}}}, "ENDPOINT_NOT_ALLOWED"},
		{"secret in env", &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: "/usr/bin/env", Env: map[string]string{"GITHUB_TOKEN": secret}}}}, "SECRET_IN_ENV"},
	} {
		_, err := s.Registry.CreateConnection(platform, &registryv1.CreateConnectionRequest{DisplayName: tc.name, Owner: "ines", Transport: tc.transport})
		if !apierror.Is(err, codes.InvalidArgument, tc.reason) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT %s", tc.name, err, tc.reason)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the refusal echoes the secret", tc.name)
		}
	}
	list, err := s.Registry.ListConnections(platform, &registryv1.ListConnectionsRequest{})
	if err != nil || len(list.GetConnections()) != 0 {
		t.Fatalf("connections after refusals: %v, %v", list, err)
	}

	// A loopback endpoint passes the registry (a name may resolve anywhere)
	// but the adapter refuses it at dial time, after review.
	conn, err := s.Connect(platform, &registryv1.CreateConnectionRequest{DisplayName: "loop", Owner: "ines",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: strings.Replace(loop.URL, "127.0.0.1", "localhost", 1)}}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Adapter.Discover(platform, &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if !apierror.Is(err, codes.FailedPrecondition, "ENDPOINT_NOT_ALLOWED") {
		t.Errorf("discover a loopback endpoint: %v, want ENDPOINT_NOT_ALLOWED", err)
	}
	if hits.Load() != 0 {
		t.Fatalf("the loopback server got %d requests", hits.Load())
	}
}
