package adapter

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestCredentialReachesServerAndNothingElse plants a secret, checks the
// server received exactly it (by digest), and that it appears in no log,
// response, trace, snapshot or error.
func TestCredentialReachesServerAndNothingElse(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"stdio", "http"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var logs testkit.SyncBuffer
			e := newEnvLog(t, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
			secret, ref := e.plantSecret(t)
			conn := e.httpConn(httpURL)
			if kind == "stdio" {
				conn = e.stdioConn("--hostile")
			}
			conn = e.registry.add(&registryv1.Connection{Transport: conn.GetTransport(), CredentialRef: ref})

			var seen []string // every text the test can observe
			seeMsg := func(m proto.Message) { seen = append(seen, prototext.Format(m)) }

			req := call(t, conn, "whoami", map[string]any{}, nil)
			req.TaskId = "task_cred"
			resp := execute(t, e, req)
			if got := textOf(t, resp); got != fixture.CredentialDigest(secret) {
				t.Errorf("the server received a credential with digest %s, want the planted one's %s", got, fixture.CredentialDigest(secret))
			}
			seeMsg(resp)
			if kind == "stdio" {
				names := textOf(t, execute(t, e, call(t, conn, "env", map[string]any{}, nil)))
				if !slices.Contains(strings.Split(names, "\n"), CredentialEnv) {
					t.Errorf("local server environment %q lacks %s", names, CredentialEnv)
				}
			}
			// Failures after the credential was injected.
			for _, tool := range []string{"crash", "export"} {
				r := call(t, conn, tool, map[string]any{}, nil)
				r.TaskId = "task_cred"
				seeMsg(execute(t, e, r))
			}
			snap, err := e.srv.Discover(testkit.AsService(context.Background(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
			if err != nil {
				t.Fatal(err)
			}
			seeMsg(snap)
			h, err := e.srv.Health(context.Background(), &adapterv1.HealthRequest{ConnectionId: conn.GetId()})
			if err != nil || !h.GetHealthy() {
				t.Fatalf("Health = %v, %v", h, err)
			}
			seeMsg(h)
			got, _ := e.registry.GetConnection(context.Background(), &registryv1.GetConnectionRequest{Id: conn.GetId()})
			seeMsg(got)

			// A credential that cannot be read is a clear, safe failure.
			missing := e.registry.add(&registryv1.Connection{Transport: conn.GetTransport(), CredentialRef: "file:missing-" + secret[:4]})
			r := execute(t, e, call(t, missing, "whoami", map[string]any{}, nil))
			wantFailure(t, r, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeCredentialUnavailable)
			seeMsg(r)
			_, err = e.srv.Discover(testkit.AsService(context.Background(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: missing.GetId()})
			if !apierror.Is(err, codes.FailedPrecondition, "CREDENTIAL_UNAVAILABLE") {
				t.Errorf("Discover with an unreadable credential: %v", err)
			}
			seen = append(seen, err.Error())

			e.evidence.mu.Lock()
			if len(e.evidence.events) == 0 {
				t.Error("no protocol trace was appended")
			}
			for _, ev := range e.evidence.events {
				seeMsg(ev)
			}
			e.evidence.mu.Unlock()
			seen = append(seen, logs.String())
			if !strings.Contains(logs.String(), "executed") {
				t.Error("the log capture saw nothing; the check would be empty")
			}
			for i, s := range seen {
				if strings.Contains(s, secret) {
					t.Errorf("the planted secret leaked into observation %d: %s", i, s)
				}
			}
		})
	}
}

// TestCredentialRoots: a reference resolves only inside the connection's
// own directory under a root; every other file, another connection's
// secret, a host file, a link out, is refused or unreadable, and no
// refusal carries a value.
func TestCredentialRoots(t *testing.T) {
	t.Parallel()
	root, second, outside := t.TempDir(), t.TempDir(), t.TempDir()
	write := func(path, v string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	own, other := filepath.Join(root, "con_a"), filepath.Join(root, "con_b")
	write(filepath.Join(own, "token"), "secret-a")
	write(filepath.Join(other, "token"), "secret-b")
	write(filepath.Join(outside, "token"), "secret-outside")
	write(filepath.Join(second, "con_a", "later"), "secret-later")
	// A mounted Secret: keys are links into a timestamped directory.
	write(filepath.Join(own, "..2026_12_07", "key"), "secret-mounted")
	if err := os.Symlink("..2026_12_07", filepath.Join(own, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/key", filepath.Join(own, "key")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "token"), filepath.Join(own, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../con_b/token", filepath.Join(own, "neighbour")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(own, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	roots := credentialRoots{root, second}
	const ok, refused, unreadable = "ok", "refused", "unreadable"
	for _, tt := range []struct {
		name, conn, ref, want, value string
		roots                        credentialRoots
	}{
		{name: "a name in its directory", conn: "con_a", ref: "file:token", want: ok, value: "secret-a"},
		{name: "its absolute path", conn: "con_a", ref: "file:" + filepath.Join(own, "token"), want: ok, value: "secret-a"},
		{name: "a mounted Secret's key", conn: "con_a", ref: "file:key", want: ok, value: "secret-mounted"},
		{name: "a name in a later root", conn: "con_a", ref: "file:later", want: ok, value: "secret-later"},
		{name: "no reference", conn: "con_a", ref: "", want: ok},
		{name: "a neighbour by name", conn: "con_a", ref: "file:../con_b/token", want: refused},
		{name: "a neighbour by path", conn: "con_a", ref: "file:" + filepath.Join(other, "token"), want: refused},
		{name: "a neighbour climbing back", conn: "con_a", ref: "file:" + own + "/../con_b/token", want: refused},
		{name: "a host file", conn: "con_a", ref: "file:/etc/machine-id", want: refused},
		{name: "the adapter's own token", conn: "con_a", ref: "file:/var/run/secrets/kubernetes.io/serviceaccount/token", want: refused},
		{name: "a file outside the roots", conn: "con_a", ref: "file:" + filepath.Join(outside, "token"), want: refused},
		{name: "the directory itself", conn: "con_a", ref: "file:" + own, want: refused},
		{name: "the root", conn: "con_a", ref: "file:" + root, want: refused},
		{name: "no connection id", conn: "", ref: "file:token", want: refused},
		{name: "a climbing connection id", conn: "..", ref: "file:con_b/token", want: refused},
		{name: "no roots", conn: "con_a", ref: "file:token", roots: credentialRoots{}, want: refused},
		{name: "a link out of the directory", conn: "con_a", ref: "file:out", want: unreadable},
		{name: "a link to a neighbour", conn: "con_a", ref: "file:neighbour", want: unreadable},
		{name: "a FIFO", conn: "con_a", ref: "file:fifo", want: unreadable},
		{name: "a missing file", conn: "con_a", ref: "file:missing", want: unreadable},
		{name: "another scheme", conn: "con_a", ref: "secret://vault/a", want: unreadable},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := roots
			if tt.roots != nil {
				r = tt.roots
			}
			v, err := r.read(tt.conn, tt.ref)
			var ce *credentialError
			var cr *credentialRefusedError
			got := ok
			switch {
			case errors.As(err, &cr):
				got = refused
			case errors.As(err, &ce):
				got = unreadable
			case err != nil:
				t.Fatalf("unexpected error %v", err)
			}
			if got != tt.want || v != tt.value {
				t.Fatalf("read(%q, %q) = %q, %v (%s), want %q (%s)", tt.conn, tt.ref, v, err, got, tt.value, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "secret-") {
				t.Errorf("the error carries a value: %v", err)
			}
		})
	}
}

// TestCredentialRootsConfigured: the default root lies beside the working
// directory, and a root overlapping it is dropped.
func TestCredentialRootsConfigured(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	wd := filepath.Join(data, "work")
	log := slog.New(slog.DiscardHandler)
	if got := (Deps{}).credentialRoots(wd, log); !slices.Equal(got, credentialRoots{filepath.Join(data, "credentials")}) {
		t.Errorf("default roots %v, want %s/credentials", got, data)
	}
	if got := (Deps{CredentialRoots: []string{}}).credentialRoots(wd, log); len(got) != 0 {
		t.Errorf("an empty list gave roots %v", got)
	}
	got := (Deps{CredentialRoots: []string{data, wd, filepath.Join(wd, "x"), filepath.Join(data, "creds")}}).credentialRoots(wd, log)
	if !slices.Equal(got, credentialRoots{filepath.Join(data, "creds")}) {
		t.Errorf("roots %v, want only %s/creds: the others overlap the working directory", got, data)
	}
}

// TestCredentialOutsideRootsIsRefused: a connection whose reference lies
// outside its directory is refused by every call with
// CREDENTIAL_REF_NOT_ALLOWED; its server is neither started nor contacted.
func TestCredentialOutsideRootsIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, "counted", http.StatusTeapot)
	}))
	t.Cleanup(srv.Close)
	_, neighbour := e.plantSecret(t)
	victim := e.registry.add(&registryv1.Connection{Transport: e.httpConn(srv.URL).GetTransport(), CredentialRef: neighbour})
	for _, ref := range []string{
		"file:/etc/machine-id",
		"file:" + filepath.Join(e.registry.credRoot, victim.GetId(), strings.TrimPrefix(neighbour, "file:")),
		"file:../" + victim.GetId() + "/" + strings.TrimPrefix(neighbour, "file:"),
	} {
		t.Run(ref, func(t *testing.T) {
			for _, conn := range []*registryv1.Connection{
				e.registry.add(&registryv1.Connection{Transport: e.httpConn(srv.URL + "/mcp").GetTransport(), CredentialRef: ref}),
				e.registry.add(&registryv1.Connection{Transport: e.stdioConn().GetTransport(), CredentialRef: ref}),
			} {
				r := execute(t, e, call(t, conn, "whoami", map[string]any{}, nil))
				wantFailure(t, r, adapterv1.Outcome_OUTCOME_FORBIDDEN, CodeCredentialRefNotAllowed)
				if r.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED {
					t.Errorf("stage %v, want PREPARED: nothing was sent", r.GetStage())
				}
				_, err := e.srv.Discover(testkit.AsService(t.Context(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
				if !apierror.Is(err, codes.FailedPrecondition, CodeCredentialRefNotAllowed) {
					t.Errorf("Discover: %v, want FAILED_PRECONDITION %s", err, CodeCredentialRefNotAllowed)
				}
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the server received %d requests", n)
	}
	if n := e.srv.procStarts.Load(); n != 0 {
		t.Errorf("%d local servers started", n)
	}
}
