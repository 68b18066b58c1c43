package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/registry"
	"github.com/v0m3/v0m3/suite"
)

// `v0m3 connect` registers a remote server with an OAuth client through
// the real registry: what the flags say is what is recorded (pending
// review); a secret value where a reference belongs is refused with the
// registry's reason and is not echoed; OAuth flags without a grant are a
// usage error that sends nothing.
func TestConnectOAuth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: dir, Services: []string{suite.Registry, suite.Policy}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	tok, err := s.Dev.Issuer.Mint("ines", []string{"platform"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	connect := func(args ...string) (string, error) {
		args = append(args, "--registry-addr", s.Addr[suite.Registry], "--token", tok, "--tls-ca-file", filepath.Join(dir, "pki", "ca.crt"))
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		err := runConnect(ctx, args, &out, &bytes.Buffer{})
		return out.String(), err
	}
	base := []string{"--name", "search", "--owner", "platform", "--url", "https://search.example/mcp"}

	out, err := connect(append(base, "--oauth-grant", "client_credentials", "--oauth-client-id", "v0m3-search",
		"--oauth-client-secret-ref", "file:/var/run/secrets/v0m3/search/oauth-secret", "--oauth-issuer", "https://auth.example.com",
		"--oauth-scopes", "search:read search:list", "--oauth-resource", "https://search.example/mcp")...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	var conn registryv1.Connection
	if err := protojson.Unmarshal([]byte(out), &conn); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	o := conn.GetTransport().GetStreamableHttp().GetOauth()
	if o.GetGrant() != registryv1.OauthGrant_OAUTH_GRANT_CLIENT_CREDENTIALS || o.GetClientId() != "v0m3-search" ||
		o.GetClientSecretRef() != "file:/var/run/secrets/v0m3/search/oauth-secret" || o.GetIssuer() != "https://auth.example.com" ||
		strings.Join(o.GetScopes(), " ") != "search:read search:list" || o.GetResource() != "https://search.example/mcp" ||
		conn.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_PENDING {
		t.Errorf("recorded connection = %v", &conn)
	}

	out, err = connect(append(base, "--oauth-grant", "token_exchange", "--oauth-client-id", "v0m3-boundary",
		"--oauth-client-secret-ref", "file:/var/run/secrets/v0m3/search/oauth-secret", "--oauth-issuer", "https://auth.example.com",
		"--oauth-audience", "search", "--oauth-requested-token-type", "urn:ietf:params:oauth:token-type:access_token")...)
	if err != nil {
		t.Fatalf("connect with token exchange: %v", err)
	}
	var exchange registryv1.Connection
	if err := protojson.Unmarshal([]byte(out), &exchange); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	if o := exchange.GetTransport().GetStreamableHttp().GetOauth(); o.GetGrant() != registryv1.OauthGrant_OAUTH_GRANT_TOKEN_EXCHANGE ||
		o.GetAudience() != "search" || o.GetRequestedTokenType() != "urn:ietf:params:oauth:token-type:access_token" {
		t.Errorf("recorded token exchange connection = %v", &exchange)
	}

	_, err = connect(append(base, "--oauth-grant", "client_credentials", "--oauth-client-id", "v0m3-search",
		"--oauth-client-secret-ref", "hunter2-secret-value", "--oauth-issuer", "https://auth.example.com")...)
	if reasonOf(err) != registry.ReasonInvalidOAuth || status.Code(errors.Unwrap(err)) != codes.InvalidArgument || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("secret value as reference: error = %v; want %s without the value", err, registry.ReasonInvalidOAuth)
	}

	var ue usageError
	if _, err := connect(append(base, "--oauth-client-id", "v0m3-search")...); !errors.As(err, &ue) {
		t.Errorf("OAuth flags without a grant: error = %v; want a usage error", err)
	}
	if _, err := connect(append(base, "--oauth-grant", "password")...); !errors.As(err, &ue) {
		t.Errorf("unknown grant: error = %v; want a usage error", err)
	}
	// Only the two accepted connections exist: the refusals recorded nothing.
	cc, err := grpc.NewClient(s.Addr[suite.Registry], s.CallerDialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	list, err := registryv1.NewRegistryServiceClient(cc).ListConnections(s.As(t.Context(), "ines", "platform"), &registryv1.ListConnectionsRequest{})
	if err != nil || len(list.GetConnections()) != 2 {
		t.Errorf("connections = %v, %v; want only the two accepted", list, err)
	}
}

// reasonOf is the ErrorInfo reason of a gRPC error a command wrapped.
func reasonOf(err error) string {
	for _, d := range status.Convert(errors.Unwrap(err)).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}
