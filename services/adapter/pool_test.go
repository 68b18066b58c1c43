package adapter

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// serverPID calls the fixture's pid tool: which process answered, by its
// host pid.
func serverPID(t *testing.T, e *env, conn *registryv1.Connection) int {
	t.Helper()
	resp := execute(t, e, call(t, conn, "pid", map[string]any{}, nil))
	text := textOf(t, resp)
	f := strings.Fields(text)
	if len(f) != 2 {
		t.Fatalf("pid answered %q", text)
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		t.Fatalf("pid answered %q", text)
	}
	if own, _ := os.Readlink("/proc/self/ns/pid"); own == f[1] {
		return pid
	}
	// In a PID namespace of its own: the host process in that namespace
	// with that pid there.
	entries, _ := os.ReadDir("/proc")
	for _, en := range entries {
		if ns, _ := os.Readlink("/proc/" + en.Name() + "/ns/pid"); ns != f[1] {
			continue
		}
		b, _ := os.ReadFile("/proc/" + en.Name() + "/status")
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
				if ids := strings.Fields(v); len(ids) > 1 && ids[len(ids)-1] == f[0] {
					host, _ := strconv.Atoi(ids[0])
					return host
				}
			}
		}
	}
	t.Fatalf("no host process is pid %s of %s", f[0], f[1])
	return 0
}

// gone reports whether no process pid exists (it was killed and reaped).
func gone(pid int) bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }

// release lets every wait_for call of conn's local servers finish: the
// file appears in each run directory.
func (e *env) release(t *testing.T, conn *registryv1.Connection, file string) {
	t.Helper()
	runs, err := filepath.Glob(filepath.Join(e.srv.workDir, safeName(conn.GetId()), "run-*"))
	if err != nil || len(runs) == 0 {
		t.Fatalf("no run directory of %s: %v", conn.GetId(), err)
	}
	for _, dir := range runs {
		if err := os.WriteFile(filepath.Join(dir, file), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// httpFixture starts a hostile fixture over streamable HTTP working in dir
// and logging every request to a call log; it returns its URL and a
// function that counts the requests of a method.
func httpFixture(t *testing.T, dir string, extra ...string) (url string, count func(method string) int) {
	t.Helper()
	log := filepath.Join(t.TempDir(), "calls.jsonl")
	cmd := exec.Command(fixtureBin, append([]string{"--transport", "http", "--addr", "127.0.0.1:0", "--hostile", "--call-log", log}, extra...)...)
	cmd.Dir = dir
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if u, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
			url = u
			break
		}
	}
	if url == "" {
		t.Fatal("http fixture did not report its address")
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return url, func(method string) int {
		b, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var e fixture.CallLogEntry
			if json.Unmarshal([]byte(line), &e) == nil && e.Method == method {
				n++
			}
		}
		return n
	}
}

// TestSessionIsReused: N calls over stdio start exactly one server process
// and are all answered by it; over HTTP they share one session (one
// initialize).
func TestSessionIsReused(t *testing.T) {
	t.Parallel()
	const n = 5
	t.Run("stdio", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		conn := e.stdioConn("--hostile")
		first := serverPID(t, e, conn)
		for range n - 1 {
			if pid := serverPID(t, e, conn); pid != first {
				t.Fatalf("call answered by process %d, the first by %d", pid, first)
			}
		}
		if got := e.srv.procStarts.Load(); got != 1 {
			t.Errorf("%d calls started %d server processes, want 1", n, got)
		}
	})
	t.Run("http", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		url, count := httpFixture(t, t.TempDir())
		conn := e.httpConn(url)
		first := serverPID(t, e, conn)
		for range n - 1 {
			if pid := serverPID(t, e, conn); pid != first {
				t.Fatalf("call answered by process %d, the first by %d", pid, first)
			}
		}
		if got := count("initialize"); got != 1 {
			t.Errorf("%d calls opened %d sessions (initialize requests), want 1", n, got)
		}
		if got := count("tools/call"); got != n {
			t.Errorf("server saw %d tools/call, want %d", got, n)
		}
	})
}

// TestSessionRestartsAfterCrash: a killed server process is replaced by
// the next call, which succeeds.
func TestSessionRestartsAfterCrash(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn := e.stdioConn("--hostile")
	first := serverPID(t, e, conn)
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the killed server is reaped", func() bool { return gone(first) })
	second := serverPID(t, e, conn)
	if second == first {
		t.Fatalf("answered by the killed process %d", first)
	}
	if got := e.srv.procStarts.Load(); got != 2 {
		t.Errorf("%d server processes started, want 2", got)
	}
	if got := serverPID(t, e, conn); got != second {
		t.Errorf("the call after the restart was answered by %d, want the new process %d", got, second)
	}
}

// TestNewRevisionDrains: a call in flight on the old configuration
// finishes on the old process; a call at the new revision gets a new
// process with the new credential; the old process ends once drained.
func TestNewRevisionDrains(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	secret1, ref1 := e.plantSecret(t)
	secret2, ref2 := e.plantSecret(t)
	base := e.stdioConn("--hostile")
	conn1 := e.registry.add(&registryv1.Connection{Transport: base.GetTransport(), CredentialRef: ref1})
	if got := textOf(t, execute(t, e, call(t, conn1, "whoami", map[string]any{}, nil))); got != fixture.CredentialDigest(secret1) {
		t.Fatalf("revision 1 credential: %q", got)
	}
	pid1 := serverPID(t, e, conn1)

	// A slow call in flight on revision 1.
	slow := make(chan *adapterv1.ExecuteResponse, 1)
	go func() {
		resp, err := e.srv.Execute(context.Background(), granted(t, call(t, conn1, "wait_for", map[string]any{"file": "go"}, nil)))
		if err != nil {
			t.Error(err)
		}
		slow <- resp
	}()
	testkit.Eventually(t, "the slow call is in flight", func() bool { return e.srv.pool.stats().InFlight == 1 })

	// Rotation: revision 2 with another credential.
	conn2 := e.registry.add(&registryv1.Connection{Id: conn1.GetId(), ConfigRevision: 2, Transport: base.GetTransport(), CredentialRef: ref2})
	if got := textOf(t, execute(t, e, call(t, conn2, "whoami", map[string]any{}, nil))); got != fixture.CredentialDigest(secret2) {
		t.Errorf("revision 2 call saw credential %q, want the new one", got)
	}
	pid2 := serverPID(t, e, conn2)
	if pid2 == pid1 {
		t.Fatalf("revision 2 ran on the revision 1 process %d", pid1)
	}
	if gone(pid1) {
		t.Fatal("the revision 1 process ended while a call was in flight on it")
	}
	if st := e.srv.pool.stats(); st.Sessions != 2 || st.InFlight != 1 {
		t.Errorf("pool %+v, want the draining session and the new one, one call in flight", st)
	}

	e.release(t, conn1, "go")
	if r := <-slow; r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || textOf(t, r) != "done" {
		t.Errorf("the in-flight call on revision 1: %v", r)
	}
	testkit.Eventually(t, "the drained revision 1 process ends", func() bool { return gone(pid1) })
	testkit.Eventually(t, "only the revision 2 session stays", func() bool { return e.srv.pool.stats().Sessions == 1 })
	if got := serverPID(t, e, conn2); got != pid2 {
		t.Errorf("revision 2 answered by %d, want %d", got, pid2)
	}
	if got := e.srv.procStarts.Load(); got != 2 {
		t.Errorf("%d server processes started, want 2", got)
	}
}

// TestSessionFollowsServingRevision: while a newer config revision's
// workload rolls out (the registry keeps the previous revision serving),
// calls execute at the serving revision on its session and a call
// authorized against the unserved revision is refused having sent
// nothing; once the new revision serves, the next call gets a new session
// and the old one drains and ends.
func TestSessionFollowsServingRevision(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	base := e.stdioConn("--hostile")
	conn1 := e.registry.add(&registryv1.Connection{Transport: base.GetTransport()})
	execute(t, e, call(t, conn1, "whoami", map[string]any{}, nil))
	pid1 := serverPID(t, e, conn1)

	rolling := e.registry.add(&registryv1.Connection{Id: conn1.GetId(), ConfigRevision: 2, ServingConfigRevision: 1, Transport: base.GetTransport()})
	_, err := e.srv.Execute(context.Background(), granted(t, call(t, rolling, "whoami", map[string]any{}, nil)))
	if !apierror.Is(err, codes.FailedPrecondition, "CONFIG_REVISION_CHANGED") || apierror.Info(err).GetMetadata()["current_revision"] != "1" {
		t.Fatalf("a call at revision 2 while revision 1 serves: %v; want CONFIG_REVISION_CHANGED naming serving revision 1", err)
	}
	atServing := call(t, rolling, "whoami", map[string]any{}, nil)
	atServing.ConfigRevision = 1
	if r := execute(t, e, atServing); r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("a call at the serving revision: %v", r)
	}
	if got := serverPID(t, e, conn1); got != pid1 || e.srv.procStarts.Load() != 1 {
		t.Fatalf("the serving revision's calls ran on process %d (%d started), want the revision 1 session %d", got, e.srv.procStarts.Load(), pid1)
	}

	served := e.registry.add(&registryv1.Connection{Id: conn1.GetId(), ConfigRevision: 2, ServingConfigRevision: 2, Transport: base.GetTransport()})
	execute(t, e, call(t, served, "whoami", map[string]any{}, nil))
	if pid2 := serverPID(t, e, served); pid2 == pid1 {
		t.Fatalf("revision 2 ran on the revision 1 process %d", pid1)
	}
	testkit.Eventually(t, "the revision 1 session ends", func() bool { return gone(pid1) })
	if st := e.srv.pool.stats(); st.Sessions != 1 {
		t.Errorf("pool %+v, want only the revision 2 session", st)
	}
}

// TestLimitsPerCallOnASharedSession: calls with different limits share a
// session; each is judged by its own limit, and a response over one call's
// limit neither breaks the session nor the call that allows it. A flood
// over every limit in flight closes the session; the next call opens a
// new one.
func TestLimitsPerCallOnASharedSession(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"stdio", "http"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			dir := t.TempDir()
			var conn *registryv1.Connection
			var count func(string) int
			if kind == "stdio" {
				conn = e.stdioConn("--hostile")
			} else {
				var url string
				url, count = httpFixture(t, dir)
				conn = e.httpConn(url)
			}
			pid := serverPID(t, e, conn)
			big := &registryv1.Limits{MaxResponseBytes: 1 << 20, MaxItems: 10}
			small := &registryv1.Limits{MaxResponseBytes: 16 << 10, MaxItems: 10}

			// A call with the large limit holds the session. It is its
			// own attempt: the meter tells concurrent calls' requests
			// apart by method and attempt until their ids are known.
			held := make(chan *adapterv1.ExecuteResponse, 1)
			holder := call(t, conn, "wait_for", map[string]any{"file": "go"}, big)
			holder.AttemptId = "att_held"
			go func() {
				resp, err := e.srv.Execute(context.Background(), granted(t, holder))
				if err != nil {
					t.Error(err)
				}
				held <- resp
			}()
			testkit.Eventually(t, "the large-limit call is in flight", func() bool {
				e.srv.pool.mu.Lock()
				defer e.srv.pool.mu.Unlock()
				p := e.srv.pool.current[conn.GetId()]
				return p != nil && p.ss != nil && p.ss.m.currentBound() >= big.GetMaxResponseBytes()
			})

			// 100 KiB: over the small limit, under the large one.
			const size = 100 << 10
			resp := execute(t, e, call(t, conn, "flood", map[string]any{"bytes": size}, small))
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeResponseLimitExceeded)
			if d := resp.GetError().GetAdapterDetail(); d != "response exceeded max_response_bytes=16384" {
				t.Errorf("detail %q", d)
			}
			if resp.GetResponseBytes() < size {
				t.Errorf("response bytes %d, want the whole %d-byte response charged to the call", resp.GetResponseBytes(), size)
			}
			resp = execute(t, e, call(t, conn, "flood", map[string]any{"bytes": size}, big))
			if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || len(textOf(t, resp)) != size {
				t.Errorf("the same response under the large limit: %v %v", resp.GetOutcome(), resp.GetError())
			}

			if kind == "stdio" {
				e.release(t, conn, "go")
			} else if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if r := <-held; r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
				t.Errorf("the large-limit call: %v %v", r.GetOutcome(), r.GetError())
			}
			if got := serverPID(t, e, conn); got != pid {
				t.Errorf("after a refused response the session moved to process %d, want %d", got, pid)
			}

			// Over every limit in flight: cut while it arrives, the
			// session closed, the next call on a new one.
			resp = execute(t, e, call(t, conn, "flood", map[string]any{"bytes": 256 << 20}, small))
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeResponseLimitExceeded)
			if resp.GetResponseBytes() > 2<<20 {
				t.Errorf("read %d bytes of a flood over every limit", resp.GetResponseBytes())
			}
			after := serverPID(t, e, conn)
			switch kind {
			case "stdio":
				if after == pid || !gone(pid) && e.srv.procStarts.Load() != 2 {
					t.Errorf("after the flood: process %d (before %d), %d started", after, pid, e.srv.procStarts.Load())
				}
			case "http":
				if got := count("initialize"); got != 2 {
					t.Errorf("%d sessions opened, want 2 (the flooded one closed)", got)
				}
			}
		})
	}
}

// TestConcurrencyBound: calls beyond the per-connection bound wait for a
// slot; one whose deadline passes first fails with CONNECTION_BUSY having
// sent nothing.
func TestConcurrencyBound(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, nil, func(d *Deps) { d.Sessions.MaxCallsPerConnection = 1 })
	conn := e.stdioConn("--hostile")
	held := make(chan *adapterv1.ExecuteResponse, 1)
	go func() {
		resp, err := e.srv.Execute(context.Background(), granted(t, call(t, conn, "wait_for", map[string]any{"file": "go"}, nil)))
		if err != nil {
			t.Error(err)
		}
		held <- resp
	}()
	testkit.Eventually(t, "the first call is in flight", func() bool { return e.srv.pool.stats().InFlight == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	busy, err := e.srv.Execute(ctx, granted(t, call(t, conn, "pid", map[string]any{}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	wantFailure(t, busy, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeConnectionBusy)
	if busy.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED || !strings.Contains(busy.GetError().GetAdapterDetail(), "1 calls in flight") {
		t.Errorf("busy call: stage %v detail %q", busy.GetStage(), busy.GetError().GetAdapterDetail())
	}

	// A call without a short deadline waits for the slot.
	waited := make(chan *adapterv1.ExecuteResponse, 1)
	go func() {
		resp, err := e.srv.Execute(context.Background(), granted(t, call(t, conn, "pid", map[string]any{}, nil)))
		if err != nil {
			t.Error(err)
		}
		waited <- resp
	}()
	e.release(t, conn, "go")
	if r := <-held; r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Errorf("held call: %v", r)
	}
	if r := <-waited; r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Errorf("waiting call: %v", r)
	}
	if got := e.srv.procStarts.Load(); got != 1 {
		t.Errorf("%d server processes, want 1", got)
	}
}

// TestCloseLeavesNoProcess: closing the adapter ends every session and
// local server, idle or busy.
func TestCloseLeavesNoProcess(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	idle := e.stdioConn("--hostile")
	busy := e.stdioConn("--hostile")
	pids := []int{serverPID(t, e, idle), serverPID(t, e, busy)}
	var wg sync.WaitGroup
	wg.Go(func() {
		resp, err := e.srv.Execute(context.Background(), granted(t, call(t, busy, "wait_for", map[string]any{"file": "never"}, nil)))
		if err != nil {
			t.Error(err)
			return
		}
		if resp.GetOutcome() == adapterv1.Outcome_OUTCOME_OK {
			t.Errorf("a call in flight at Close succeeded")
		}
	})
	testkit.Eventually(t, "the call is in flight", func() bool { return e.srv.pool.stats().InFlight == 1 })
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for _, pid := range pids {
		if !gone(pid) {
			t.Errorf("server process %d outlived Close", pid)
		}
	}
	if n := e.srv.procLive.Load(); n != 0 {
		t.Errorf("%d server processes not reaped after Close", n)
	}
	if st := e.srv.pool.stats(); st.Sessions != 0 {
		t.Errorf("pool after Close: %+v", st)
	}
	resp := execute(t, e, call(t, idle, "pid", map[string]any{}, nil))
	wantFailure(t, resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeAdapterShuttingDown)
	if got := e.srv.procStarts.Load(); got != 2 {
		t.Errorf("%d server processes started, want 2 (none after Close)", got)
	}
}

// TestIdleSessionCloses: a session unused for the idle timeout closes with
// its process; the next call opens a new one.
func TestIdleSessionCloses(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, nil, func(d *Deps) { d.Sessions.IdleTimeout = 20 * time.Millisecond })
	conn := e.stdioConn("--hostile")
	pid := serverPID(t, e, conn)
	testkit.Eventually(t, "the idle session closes", func() bool { return e.srv.pool.stats().Sessions == 0 })
	testkit.Eventually(t, "its process ends", func() bool { return gone(pid) })
	if got := serverPID(t, e, conn); got == pid {
		t.Errorf("answered by the closed process %d", pid)
	}
}

// TestListChangedRediscovers: a server that changes its tools at runtime
// and says so gets a new snapshot recorded at once, on the same session,
// without any further call.
func TestListChangedRediscovers(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"stdio", "http"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			conn := e.stdioConn("--redescribe-after-calls", "1")
			if kind == "http" {
				url, _ := httpFixture(t, t.TempDir(), "--redescribe-after-calls", "1")
				conn = e.httpConn(url)
			}
			resp := execute(t, e, call(t, conn, "search", map[string]any{"query": "cursor"}, &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 10, AllowedMediaTypes: []string{"text/markdown"}}))
			if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
				t.Fatalf("search: %v", resp)
			}
			var snap *registryv1.DiscoverySnapshot
			testkit.Eventually(t, "a snapshot is recorded", func() bool {
				e.registry.mu.Lock()
				defer e.registry.mu.Unlock()
				if len(e.registry.snapshots) > 0 {
					snap = e.registry.snapshots[len(e.registry.snapshots)-1]
				}
				return snap != nil
			})
			if snap.GetConnectionId() != conn.GetId() || snap.GetConfigRevision() != conn.GetConfigRevision() {
				t.Errorf("snapshot of %s at %d", snap.GetConnectionId(), snap.GetConfigRevision())
			}
			var desc string
			for _, tool := range snap.GetTools() {
				if tool.GetName() == "search" {
					desc = tool.GetDescription()
				}
			}
			if desc != fixture.DescriptionPrivate {
				t.Errorf("recorded search description %q, want the changed %q", desc, fixture.DescriptionPrivate)
			}
			if kind == "stdio" {
				if got := e.srv.procStarts.Load(); got != 1 {
					t.Errorf("%d server processes, want 1: the running server was described, not a new one", got)
				}
			}
		})
	}
}

// TestCloseDoesNotHoldTheCall: a call whose deadline passes on an HTTP
// session returns at its deadline, while the session it leaves behind is
// still closing (the server holds the session's DELETE until the test
// lets it go).
func TestCloseDoesNotHoldTheCall(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv, err := fixture.NewServer(fixture.Options{Hostile: true})
	if err != nil {
		t.Fatal(err)
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	unblock := make(chan struct{})
	var deletes atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			deletes.Add(1)
			<-unblock
		}
		h.ServeHTTP(w, r)
	}))
	var once sync.Once
	release := func() { once.Do(func() { close(unblock) }) }
	t.Cleanup(func() {
		// The adapter first, so no session holds a stream the server
		// would wait for.
		release()
		_ = e.srv.Close()
		ts.CloseClientConnections()
		ts.Close()
	})
	conn := e.httpConn(ts.URL)

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	resp, err := e.srv.Execute(ctx, granted(t, call(t, conn, "slow", map[string]any{"ms": 3000}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	wantFailure(t, resp, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeDeadlineExceeded)
	// The abandoned session is closed in the background: its DELETE
	// reaches the server and is held there, after Execute returned.
	testkit.Eventually(t, "the abandoned session's close reaches the server", func() bool { return deletes.Load() == 1 })
	// A new call gets a new session and is not held either.
	if r := execute(t, e, call(t, conn, "pid", map[string]any{}, nil)); r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Errorf("next call: %v", r)
	}
	release()
}

// TestRetiredConnectionEndsItsSession: once a connection is retired, its
// next call is refused and its long-lived server process ends, without
// waiting for the idle timeout.
func TestRetiredConnectionEndsItsSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn := e.stdioConn("--hostile")
	pid := serverPID(t, e, conn)
	retired := proto.CloneOf(conn)
	retired.State = registryv1.ConnectionState_CONNECTION_STATE_RETIRED
	e.registry.add(retired)
	if _, err := e.srv.Execute(context.Background(), granted(t, call(t, conn, "pid", map[string]any{}, nil))); !apierror.Is(err, codes.FailedPrecondition, "CONNECTION_RETIRED") {
		t.Fatalf("call on a retired connection: %v", err)
	}
	testkit.Eventually(t, "the retired connection's process ends", func() bool { return gone(pid) })
	if got := e.srv.procStarts.Load(); got != 1 {
		t.Errorf("%d processes started, want 1", got)
	}
}
