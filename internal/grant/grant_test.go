package grant_test

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/grant"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/identity/identitytest"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

func request(t *testing.T) *adapterv1.ExecuteRequest {
	t.Helper()
	args, err := structpb.NewStruct(map[string]any{"b": 2, "a": "x"})
	if err != nil {
		t.Fatal(err)
	}
	return &adapterv1.ExecuteRequest{
		ConnectionId: "conn_1", ConfigRevision: 3, MappingId: "map_1", MappingRevision: 2,
		Target:    &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "render"},
		Arguments: args, Limits: &registryv1.Limits{MaxResponseBytes: 1024, MaxItems: 1},
		TaskId: "task_1", AttemptId: "att_1",
	}
}

func TestTimes(t *testing.T) {
	t.Parallel()
	orch := identitytest.Credentials(t, identity.Orchestrator)[0]
	now := time.Now()
	tests := []struct {
		name   string
		issued time.Time
		ttl    time.Duration
		at     time.Time
		reason string
	}{
		{"within its life", now, time.Minute, now.Add(30 * time.Second), ""},
		{"just expired, within the skew", now, time.Minute, now.Add(time.Minute + grant.Skew/2), ""},
		{"expired", now, time.Minute, now.Add(time.Minute + 2*grant.Skew), grant.ReasonExpired},
		{"issued in the future", now.Add(time.Hour), time.Minute, now, grant.ReasonExpired},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g, err := grant.For(request(t), "grant_1", "int_1", "render_preview", tc.issued, tc.ttl)
			if err != nil {
				t.Fatal(err)
			}
			tok, err := grant.Sign(orch, g)
			if err != nil {
				t.Fatal(err)
			}
			_, err = grant.Verify(orch, tok, tc.at)
			var ge *grant.Error
			switch {
			case tc.reason == "" && err != nil:
				t.Errorf("Verify: %v", err)
			case tc.reason != "" && (!errors.As(err, &ge) || ge.Reason != tc.reason):
				t.Errorf("Verify: %v, want %s", err, tc.reason)
			}
		})
	}
}

// TestArgumentsDigestIsCanonical: the digest a grant binds does not depend
// on key order or on nil versus empty arguments.
func TestArgumentsDigestIsCanonical(t *testing.T) {
	t.Parallel()
	a, _ := structpb.NewStruct(map[string]any{"a": 1, "b": []any{"x", 2}})
	b, _ := structpb.NewStruct(map[string]any{"b": []any{"x", 2}, "a": 1.0})
	da, err := grant.ArgumentsDigest(a)
	if err != nil {
		t.Fatal(err)
	}
	if db, _ := grant.ArgumentsDigest(b); da != db {
		t.Errorf("same arguments, digests %s and %s", da, db)
	}
	empty, _ := grant.ArgumentsDigest(&structpb.Struct{})
	none, _ := grant.ArgumentsDigest(nil)
	if empty != none || empty == da {
		t.Errorf("empty %s, none %s, some %s", empty, none, da)
	}
}

func TestLedger(t *testing.T) {
	t.Parallel()
	l := grant.NewLedger()
	now := time.Now()
	g := grant.Grant{ID: "grant_1", ExpiresAt: now.Add(time.Minute).Unix()}
	if !l.Use(g, now) {
		t.Fatal("first use refused")
	}
	if l.Use(g, now.Add(time.Minute)) {
		t.Error("second use accepted while the grant could still verify")
	}
	if !l.Use(grant.Grant{ID: "grant_2", ExpiresAt: g.ExpiresAt}, now) {
		t.Error("another grant refused")
	}
	// Long after expiry the id is forgotten (Verify refuses it by then).
	if !l.Use(g, now.Add(time.Hour)) {
		t.Error("an expired grant id was kept forever")
	}
}
