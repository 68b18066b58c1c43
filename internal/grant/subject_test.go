package grant_test

import (
	"slices"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/v0m3/v0m3/internal/grant"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/identity/identitytest"
)

// A subject token names the requester for the connection's issuer, binds
// the attempt, expires with its grant, verifies with the orchestrator's
// JWKS, and travels inside the signed grant; without a requester or an
// audience there is none.
func TestWithSubject(t *testing.T) {
	t.Parallel()
	orch := identitytest.Credentials(t, identity.Orchestrator)[0]
	g, err := grant.For(request(t), "grant_1", "int_1", "render_preview", time.Now(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	g, err = grant.WithSubject(orch, g, "sbj_1", "alice", []string{"authors"}, "https://auth.example.com")
	if err != nil {
		t.Fatal(err)
	}
	ks, err := orch.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	var c grant.SubjectClaims
	if err := identitytest.VerifyJWT(g.SubjectToken, ks, &c); err != nil {
		t.Fatalf("the subject token does not verify with the orchestrator's JWKS: %v", err)
	}
	if c.Issuer != grant.SubjectIssuer || c.Subject != "alice" || !slices.Equal(c.Audience, jwt.Audience{"https://auth.example.com"}) ||
		c.ID != "sbj_1" || c.Expiry.Time().Unix() != g.ExpiresAt || c.TaskID != "task_1" || c.AttemptID != "att_1" ||
		c.IntentID != "int_1" || c.GrantID != "grant_1" || !slices.Equal(c.Groups, []string{"authors"}) || g.Subject != "alice" {
		t.Errorf("subject token claims %+v, grant subject %q", c, g.Subject)
	}
	signed, err := grant.Sign(orch, g)
	if err != nil {
		t.Fatal(err)
	}
	back, err := grant.Verify(orch, signed, time.Now())
	if err != nil || back.SubjectToken != g.SubjectToken || back.Subject != "alice" {
		t.Errorf("the signed grant does not carry the subject token: %v", err)
	}
	if _, err := grant.WithSubject(orch, g, "sbj_2", "", nil, "https://auth.example.com"); err == nil {
		t.Error("a subject token without a requester was made")
	}
	if _, err := grant.WithSubject(orch, g, "sbj_3", "alice", nil, ""); err == nil {
		t.Error("a subject token without an audience was made")
	}
}
