package identity_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/oidctest"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	"github.com/v0m3/v0m3/suite"
)

// TestProductServiceAuthenticatesWithRealIssuer runs the services with a
// real OAuth 2.0 authorization server (Ory Hydra) as their token issuer. A
// product service gets a client-credentials token and starts a task: the
// task's requester is who the token names. With the delegation role it
// starts a task for an end user and both identities are recorded; without
// it, it cannot. Tokens for another audience, expired ones and another
// issuer's are refused before any handler runs.
func TestProductServiceAuthenticatesWithRealIssuer(t *testing.T) {
	t.Parallel()
	hydra := oidctest.Start(t)
	other := oidctest.Start(t)
	ctx := context.Background()
	jwt, err := identity.NewJWT(ctx, identity.JWTConfig{
		Issuer: hydra.Issuer(), Audience: "v0m3", JWKSURL: hydra.JWKSURL(), Skew: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	dev, err := identity.NewDev(dir + "/pki")
	if err != nil {
		t.Fatal(err)
	}
	s, err := suite.Start(ctx, suite.Config{DataDir: dir, Identity: &suite.Identity{Creds: dev.Credentials, Authn: jwt}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)

	writer := hydra.CreateClient(t, oidctest.Client{ID: "writer-service", Audience: []string{"v0m3", "elsewhere"},
		Claims: map[string]any{"groups": []string{"product-services"}}})
	plain := hydra.CreateClient(t, oidctest.Client{ID: "plain-service", Audience: []string{"v0m3"}})
	shortLived := hydra.CreateClient(t, oidctest.Client{ID: "short-service", Audience: []string{"v0m3"}, AccessTokenLifespan: time.Second})
	impostor := other.CreateClient(t, oidctest.Client{ID: "writer-service", Audience: []string{"v0m3"},
		Claims: map[string]any{"groups": []string{"product-services"}}})
	bearer := func(tok string) context.Context { return identity.WithBearer(ctx, tok) }
	start := &orchestratorv1.StartTaskRequest{Profile: "source_review", Purpose: "review"}

	// The product service acting as itself.
	own, err := s.Orchestrator.StartTask(bearer(hydra.Token(t, plain, []string{"v0m3"})), start)
	if err != nil {
		t.Fatalf("StartTask with a real token: %v", err)
	}
	if got := own.GetTask(); got.GetRequester().GetId() != "plain-service" || got.GetActor() != "" {
		t.Fatalf("task requester %q actor %q, want plain-service and none", got.GetRequester().GetId(), got.GetActor())
	}

	// Delegation: granted by policy to product-services only.
	forAlice := &orchestratorv1.StartTaskRequest{Profile: "source_review", Purpose: "review",
		OnBehalfOf: &policyv1.Principal{Id: "alice", Groups: []string{"authors"}}}
	delegated, err := s.Orchestrator.StartTask(bearer(hydra.Token(t, writer, []string{"v0m3"})), forAlice)
	if err != nil {
		t.Fatalf("delegated StartTask: %v", err)
	}
	if got := delegated.GetTask(); got.GetRequester().GetId() != "alice" || got.GetActor() != "writer-service" {
		t.Fatalf("delegated task requester %q actor %q, want alice for writer-service", got.GetRequester().GetId(), got.GetActor())
	}
	_, err = s.Orchestrator.StartTask(bearer(hydra.Token(t, plain, []string{"v0m3"})), forAlice)
	if !apierror.Is(err, codes.PermissionDenied, "ROLE_NOT_GRANTED") {
		t.Fatalf("delegation without the role: %v, want ROLE_NOT_GRANTED", err)
	}
	// The task it started reads as its own; another service cannot read it.
	if _, err := s.Orchestrator.GetTask(bearer(hydra.Token(t, writer, []string{"v0m3"})), &orchestratorv1.GetTaskRequest{Id: delegated.GetTask().GetId()}); err != nil {
		t.Fatalf("the actor reading its task: %v", err)
	}
	_, err = s.Orchestrator.GetTask(bearer(hydra.Token(t, plain, []string{"v0m3"})), &orchestratorv1.GetTaskRequest{Id: delegated.GetTask().GetId()})
	if apierror.Code(err) != codes.PermissionDenied {
		t.Fatalf("another service reading the task: %v, want PERMISSION_DENIED", err)
	}

	// Refusals, each before the handler.
	expired := hydra.Token(t, shortLived, []string{"v0m3"})
	time.Sleep(3 * time.Second) // past its one-second lifetime and the one-second skew
	for _, tc := range []struct {
		name, token, reason string
	}{
		{"audience of another service", hydra.Token(t, writer, []string{"elsewhere"}), "TOKEN_AUDIENCE_MISMATCH"},
		{"expired", expired, "TOKEN_EXPIRED"},
		{"another issuer, same client id", other.Token(t, impostor, []string{"v0m3"}), "TOKEN_SIGNATURE_INVALID"},
	} {
		_, err := s.Orchestrator.StartTask(bearer(tc.token), forAlice)
		if !apierror.Is(err, codes.Unauthenticated, tc.reason) {
			t.Errorf("%s: %v, want UNAUTHENTICATED %s", tc.name, err, tc.reason)
		}
	}
}
