// Package bridge serves a stdio MCP server over MCP streamable HTTP. Each
// HTTP session gets its own child process running the server's command, and
// JSON-RPC messages are relayed unchanged between the session and the
// child's stdin/stdout: the bridge adds no tools and interprets nothing, so
// what the adapter discovers is exactly what the server says.
//
// `v0m3 bridge` runs it inside an MCPServer's pod; an init container copies
// the v0m3 binary into the pod with Install.
package bridge

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/v0m3/v0m3/internal/hostguard"
	"github.com/v0m3/v0m3/internal/stdionoise"
	"github.com/v0m3/v0m3/internal/stranger"
)

// Defaults for Options.
const (
	// DefaultMaxSessions bounds concurrent sessions when Options leave it 0.
	DefaultMaxSessions = 16
	// DefaultIdleTimeout ends a session nobody has used for this long.
	DefaultIdleTimeout = 5 * time.Minute
	// DefaultBodyTimeout bounds reading the body of a request that would
	// start a session.
	DefaultBodyTimeout = 10 * time.Second
)

// childGrace is how long a child may take to exit after SIGTERM before it
// is killed.
const childGrace = 5 * time.Second

// Options configures a Bridge.
type Options struct {
	// Command is the server's executable and arguments. Required.
	Command []string
	// Env is the child's environment; nil inherits the bridge's (in a pod,
	// exactly what the MCPServer's spec set).
	Env []string
	// Dir is the child's working directory; "" inherits the bridge's.
	Dir string
	// MaxSessions bounds concurrent sessions, and so child processes. At
	// the bound a new session takes the place of the session idle the
	// longest (no call in progress; one with no stream open first); when
	// every session has a call in progress it is refused (503). Zero means
	// DefaultMaxSessions.
	MaxSessions int
	// IdleTimeout ends a session, and stops its child, once no request of
	// it has been in progress for this long: a client that goes away
	// without DELETE (a crash, a dropped connection) holds neither a
	// process nor a place under MaxSessions for longer. An open GET stream
	// counts as in progress. Zero means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// BodyTimeout bounds how long the bridge waits for the body of a POST
	// without a session (which it reads to decide whether to start one).
	// Zero means DefaultBodyTimeout.
	BodyTimeout time.Duration
	// AllowedHosts are the host names (without port) a request may name in
	// its Host header and, when it sends one, its Origin. Loopback names
	// and addresses are always allowed. Anything else is refused with 403
	// before any child starts: a page that rebinds its own DNS name to the
	// bridge's address (DNS rebinding) still sends its own name.
	AllowedHosts []string
	// Log receives structured logs; nil discards them.
	Log *slog.Logger
	// Stderr receives the children's stderr; nil uses os.Stderr.
	Stderr io.Writer
}

// Bridge is an http.Handler serving one MCP endpoint.
type Bridge struct {
	opts  Options
	hosts hostguard.Hosts
	// refused logs refusals of requests nobody authenticated: clipped
	// and rate-bounded, whatever a flood of them looks like.
	refused *stranger.Refusals
	// events keeps what each session's streams carried (bounded, oldest
	// first out), so a message for a stream the client has not opened yet
	// waits for it and a dropped stream resumes with Last-Event-ID.
	events *mcp.MemoryEventStore

	mu       sync.Mutex
	sessions map[string]*session
	closed   bool
	// children counts child processes not yet waited for.
	children sync.WaitGroup
}

// session is one HTTP session and the child process serving it.
type session struct {
	id        string
	transport *mcp.StreamableServerTransport
	cancel    context.CancelFunc
	// ctxDone is closed once the session has ended.
	ctxDone <-chan struct{}

	mu       sync.Mutex
	active   int         // requests of this session in progress
	gen      int         // bumped whenever active drops to zero
	idle     *time.Timer // ends the session when it fires at the current gen
	posts    int         // POSTs of this session in progress (active less GET streams)
	lastPost time.Time   // when the last POST ended (or the session started)
}

// New returns a Bridge. Close it to stop every child.
func New(opts Options) (*Bridge, error) {
	if len(opts.Command) == 0 || opts.Command[0] == "" {
		return nil, errors.New("bridge: a command is required")
	}
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = DefaultMaxSessions
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.BodyTimeout <= 0 {
		opts.BodyTimeout = DefaultBodyTimeout
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	return &Bridge{opts: opts, hosts: hostguard.New(opts.AllowedHosts), refused: &stranger.Refusals{Log: opts.Log}, events: mcp.NewMemoryEventStore(nil), sessions: map[string]*session{}}, nil
}

// ServeHTTP implements MCP streamable HTTP: a POST without a session id
// starts a session (and a child); later requests carry its id. Every error
// the bridge answers is a JSON-RPC error object.
func (b *Bridge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := b.hosts.Check(r); err != nil {
		b.refused.Warn(r.Context(), "request refused", "reason", err, "remote", r.RemoteAddr)
		writeError(w, http.StatusForbidden, nil, jsonrpc.CodeInvalidRequest, "Forbidden: "+err.Error(), nil)
		return
	}
	w = &jsonErrors{ResponseWriter: w}
	defer w.(*jsonErrors).finish()
	id := r.Header.Get("Mcp-Session-Id")
	switch {
	case r.Method == http.MethodDelete:
		if s := b.lookup(id); s != nil {
			b.end(s, "deleted")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		writeError(w, http.StatusNotFound, nil, jsonrpc.CodeInvalidRequest, "session not found", nil)
	case r.Method != http.MethodGet && r.Method != http.MethodPost:
		w.Header().Set("Allow", "GET, POST, DELETE")
		writeError(w, http.StatusMethodNotAllowed, nil, jsonrpc.CodeInvalidRequest, "method not allowed", nil)
	case id != "":
		s := b.lookup(id)
		get := r.Method == http.MethodGet
		if s == nil || !s.enter(get) {
			writeError(w, http.StatusNotFound, nil, jsonrpc.CodeInvalidRequest, "session not found", nil)
			return
		}
		defer b.leave(s, get)
		s.transport.ServeHTTP(w, r)
	case r.Method == http.MethodGet:
		writeError(w, http.StatusBadRequest, nil, jsonrpc.CodeInvalidRequest, "a GET needs an Mcp-Session-Id", nil)
	default:
		// Only initialize starts a session: anything else without a session
		// id (e.g. a stateless server/discover probe) would start a child
		// that nobody can address again.
		// A client that sends its body slowly, or never, is cut off
		// before it can hold a connection for long; no child starts.
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(b.opts.BodyTimeout))
		msg, err := readFirst(r)
		if err != nil {
			// Whatever is left of the body is not worth waiting for.
			w.Header().Set("Connection", "close")
		} else {
			_ = rc.SetReadDeadline(time.Time{})
		}
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			writeError(w, http.StatusRequestTimeout, nil, jsonrpc.CodeInvalidRequest, "the request body did not arrive in time", nil)
			return
		case err != nil:
			writeError(w, http.StatusBadRequest, nil, jsonrpc.CodeParseError, "Parse error: the body is not a JSON-RPC message", nil)
			return
		}
		if msg.Method != "initialize" {
			refuseSessionless(w, r, msg)
			return
		}
		s, status, err := b.start()
		if err != nil {
			writeError(w, status, msg.ID, jsonrpc.CodeInternalError, err.Error(), nil)
			return
		}
		defer b.leave(s, false)
		s.transport.ServeHTTP(w, r)
	}
}

// statefulVersions are the protocol versions whose lifecycle is an
// initialize handshake and a session: the only kind the bridge serves,
// since each session is one child process.
var statefulVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}

// refuseSessionless answers a request that needs a session but has none.
// A client speaking a stateless protocol version (2026-07-28 and later,
// e.g. a server/discover probe) gets UnsupportedProtocolVersion with the
// versions the bridge serves, so it falls back to initialize; others are
// told to initialize.
func refuseSessionless(w http.ResponseWriter, r *http.Request, msg firstMessage) {
	requested := r.Header.Get("Mcp-Protocol-Version")
	if requested == "" {
		requested = msg.Params.Meta.ProtocolVersion
	}
	if requested != "" && !slices.Contains(statefulVersions, requested) {
		requested = stranger.Clip(requested) // a stranger's header, repeated in the answer
		writeError(w, http.StatusBadRequest, msg.ID, mcp.CodeUnsupportedProtocolVersion,
			fmt.Sprintf("protocol version %q is not supported by this bridge: it serves stateful sessions; start one with initialize", requested),
			mcp.UnsupportedProtocolVersionData{Supported: statefulVersions, Requested: requested})
		return
	}
	writeError(w, http.StatusBadRequest, msg.ID, jsonrpc.CodeInvalidRequest,
		"Bad Request: this bridge serves stateful sessions; start one with initialize", nil)
}

// maxInitializeBody bounds the body the bridge reads of a POST without a
// session to decide whether to start one.
const maxInitializeBody = 1 << 20

// firstMessage is what the bridge reads of a POST without a session.
type firstMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		Meta struct {
			ProtocolVersion string `json:"io.modelcontextprotocol/protocolVersion"`
		} `json:"_meta"`
	} `json:"params"`
}

// readFirst parses the POST body as one JSON-RPC message, leaving the body
// readable for the transport.
func readFirst(r *http.Request) (firstMessage, error) {
	var msg firstMessage
	body, err := io.ReadAll(io.LimitReader(r.Body, maxInitializeBody))
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return msg, err
	}
	err = json.Unmarshal(body, &msg)
	return msg, err
}

// writeError answers with a JSON-RPC error object. id is the request's id
// when the bridge could read it, else null.
func writeError(w http.ResponseWriter, status int, id json.RawMessage, code int64, message string, data any) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	type rpcError struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
		Data    any    `json:"data,omitempty"`
	}
	body, err := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}{"2.0", id, rpcError{code, message, data}})
	if err != nil { // an id that is not valid JSON cannot be echoed
		body, _ = json.Marshal(map[string]any{"jsonrpc": "2.0", "id": nil, "error": rpcError{code, message, data}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// maxErrorText bounds the plain-text error a transport answer may carry
// into the JSON-RPC error the bridge sends instead.
const maxErrorText = 1 << 10

// jsonErrors turns the plain-text error answers of the go-sdk's transport
// (e.g. a malformed body, an unacceptable Accept header) into JSON-RPC
// error objects, so a client always gets one shape of error.
type jsonErrors struct {
	http.ResponseWriter
	status int
	text   bool // capturing a plain-text error body
	body   []byte
	wrote  bool
}

func (j *jsonErrors) WriteHeader(status int) {
	if j.wrote {
		return
	}
	j.wrote = true
	j.status = status
	if status >= 400 && strings.HasPrefix(j.Header().Get("Content-Type"), "text/plain") {
		j.text = true
		return
	}
	j.ResponseWriter.WriteHeader(status)
}

func (j *jsonErrors) Write(p []byte) (int, error) {
	if !j.wrote {
		j.WriteHeader(http.StatusOK)
	}
	if j.text {
		if room := maxErrorText - len(j.body); room > 0 {
			j.body = append(j.body, p[:min(room, len(p))]...)
		}
		return len(p), nil
	}
	return j.ResponseWriter.Write(p)
}

// Flush keeps SSE streams flowing through the wrapper.
func (j *jsonErrors) Flush() {
	if !j.text {
		if f, ok := j.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (j *jsonErrors) Unwrap() http.ResponseWriter { return j.ResponseWriter }

// finish sends the captured plain-text error as a JSON-RPC error.
func (j *jsonErrors) finish() {
	if !j.text {
		return
	}
	h := j.ResponseWriter.Header()
	h.Del("X-Content-Type-Options")
	code := int64(jsonrpc.CodeInvalidRequest)
	if j.status >= 500 {
		code = jsonrpc.CodeInternalError
	}
	writeError(j.ResponseWriter, j.status, nil, code, strings.TrimSpace(string(j.body)), nil)
}

func (b *Bridge) lookup(id string) *session {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sessions[id]
}

// enter marks a request of s in progress (get: a GET stream); it reports
// false for a session that has already ended.
func (s *session) enter(get bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.ended():
		return false
	default:
	}
	s.active++
	if !get {
		s.posts++
	}
	if s.idle != nil {
		s.idle.Stop()
	}
	return true
}

// ended is closed when the session's context is cancelled.
func (s *session) ended() <-chan struct{} { return s.ctxDone }

// leave marks a request of s finished; when none is left the idle timer
// starts, and ends the session unless a request arrives first.
func (b *Bridge) leave(s *session, get bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active--
	if !get {
		s.posts--
		s.lastPost = time.Now()
	}
	if s.active > 0 {
		return
	}
	s.gen++
	gen := s.gen
	s.idle = time.AfterFunc(b.opts.IdleTimeout, func() {
		s.mu.Lock()
		expired := s.active == 0 && s.gen == gen
		s.mu.Unlock()
		if expired {
			b.end(s, "idle")
		}
	})
}

// start creates a session and its child process. The session is returned
// entered (see enter): the caller leaves it when its request is done.
func (b *Bridge) start() (*session, int, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, http.StatusServiceUnavailable, errors.New("bridge is shutting down")
	}
	if len(b.sessions) >= b.opts.MaxSessions {
		// At the bound, the session idle the longest (no POST in
		// progress; a GET stream may be open) gives way: a client that went
		// away without DELETE, or only listens, must not lock others out
		// until it expires. A client that comes back to it gets 404 and
		// initializes again, as the protocol says. Only when every session
		// has a call in progress is the new one refused.
		victim := b.idlest()
		if victim == nil {
			b.mu.Unlock()
			return nil, http.StatusServiceUnavailable, fmt.Errorf("too many sessions (%d), each with a call in progress; retry later", b.opts.MaxSessions)
		}
		delete(b.sessions, victim.id)
		victim.cancel()
		b.opts.Log.Info("session ended", "session", victim.id, "reason", "evicted: idle at the session bound")
	}
	id := rand.Text()
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{id: id, transport: &mcp.StreamableServerTransport{SessionID: id, EventStore: b.events}, cancel: cancel,
		ctxDone: ctx.Done(), active: 1, posts: 1, lastPost: time.Now()}
	b.sessions[id] = s
	b.mu.Unlock()

	fail := func(err error) (*session, int, error) {
		b.end(s, "failed")
		b.opts.Log.Error("start session", "session", id, "err", err)
		return nil, http.StatusBadGateway, errors.New("the MCP server could not be started")
	}
	httpConn, err := s.transport.Connect(ctx)
	if err != nil {
		return fail(err)
	}
	childConn, pid, err := b.startChild(ctx, s)
	if err != nil {
		httpConn.Close()
		return fail(err)
	}
	b.opts.Log.Info("session started", "session", id, "pid", pid)

	var once sync.Once
	stop := func() {
		once.Do(func() {
			httpConn.Close()
			childConn.Close()
			b.end(s, "closed")
		})
	}
	log := b.opts.Log.With("session", id)
	go relay(ctx, httpConn, childConn, log, stop)
	go relay(ctx, childConn, httpConn, log, stop)
	return s, 0, nil
}

// idlest returns the session whose last call ended the longest ago among
// those with none in progress, preferring sessions with no stream open
// either; nil when every session has a call in progress. b.mu is held.
func (b *Bridge) idlest() *session {
	var victim *session
	var victimQuiet bool
	var since time.Time
	for _, s := range b.sessions {
		s.mu.Lock()
		posts, quiet, last := s.posts, s.active == 0, s.lastPost
		s.mu.Unlock()
		if posts > 0 {
			continue
		}
		if victim == nil || quiet && !victimQuiet || quiet == victimQuiet && last.Before(since) {
			victim, victimQuiet, since = s, quiet, last
		}
	}
	return victim
}

// startChild runs the server's command for s and connects to its
// stdin/stdout. The child is stopped (SIGTERM, then SIGKILL after
// childGrace) when ctx is cancelled, and waited for (see Close), so an
// ended session leaves no process, not even a zombie.
func (b *Bridge) startChild(ctx context.Context, s *session) (mcp.Connection, int, error) {
	cmd := exec.CommandContext(ctx, b.opts.Command[0], b.opts.Command[1:]...)
	cmd.Env, cmd.Dir, cmd.Stderr = b.opts.Env, b.opts.Dir, b.opts.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = childGrace
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, 0, err
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		return nil, 0, err
	}
	cmd.Stdout = stdoutW
	if err := cmd.Start(); err != nil {
		stdoutR.Close()
		stdoutW.Close()
		return nil, 0, err
	}
	stdoutW.Close() // the child holds its own copy
	b.children.Add(1)
	go func() {
		defer b.children.Done()
		err := cmd.Wait()
		b.opts.Log.Info("server process exited", "session", s.id, "pid", cmd.Process.Pid, "status", exitStatus(err))
	}()
	// The child's non-JSON stdout lines are dropped and logged, bounded.
	out := stdionoise.New(stdoutR, stdionoise.Options{Log: b.opts.Log.With("session", s.id)})
	conn, err := (&mcp.IOTransport{Reader: out, Writer: stdin}).Connect(ctx)
	if err != nil {
		s.cancel()
		return nil, 0, err
	}
	return conn, cmd.Process.Pid, nil
}

// exitStatus describes how a child ended, for the log.
func exitStatus(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}

// relay copies messages from one side to the other until either fails.
// A message the HTTP side rejects without breaking the session (e.g. a
// notification for a client that has no stream open to receive it) is
// dropped and logged, never a reason to end the session: the call it
// belongs to must still get its answer.
func relay(ctx context.Context, from, to mcp.Connection, log *slog.Logger, stop func()) {
	defer stop()
	for {
		msg, err := from.Read(ctx)
		if err != nil {
			return
		}
		if err := to.Write(ctx, msg); err != nil {
			if rejectedOnly(err) {
				log.Debug("message not delivered to the client", "err", err)
				continue
			}
			return
		}
	}
}

// codeRejected is the go-sdk transport's JSON-RPC code for a message it
// did not deliver while the session stays usable.
const codeRejected = -32005

// rejectedOnly reports whether a write error left the session usable.
func rejectedOnly(err error) bool {
	var werr *jsonrpc.Error
	return errors.As(err, &werr) && werr.Code == codeRejected
}

// end forgets a session and stops its child.
func (b *Bridge) end(s *session, why string) {
	b.mu.Lock()
	forgot := b.sessions[s.id] == s
	if forgot {
		delete(b.sessions, s.id)
	}
	b.mu.Unlock()
	s.cancel()
	if forgot {
		b.opts.Log.Info("session ended", "session", s.id, "reason", why)
	}
}

// Sessions reports how many sessions are open.
func (b *Bridge) Sessions() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.sessions)
}

// Close ends every session, stops their children and waits until every
// child the bridge started has exited and been waited for.
func (b *Bridge) Close() {
	b.mu.Lock()
	b.closed = true
	all := b.sessions
	b.sessions = map[string]*session{}
	b.mu.Unlock()
	for _, s := range all {
		s.cancel()
	}
	b.children.Wait()
}

// Install copies the running executable to dir/v0m3, so an init container
// can hand the bridge to a server image that does not contain it.
func Install(dir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find own executable: %w", err)
	}
	in, err := os.Open(self)
	if err != nil {
		return "", fmt.Errorf("open own executable: %w", err)
	}
	defer in.Close()
	dst := filepath.Join(dir, "v0m3")
	tmp, err := os.CreateTemp(dir, ".v0m3-*")
	if err != nil {
		return "", fmt.Errorf("install into %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return "", fmt.Errorf("copy executable: %w", err)
	}
	if err := tmp.Chmod(0o555); err != nil {
		tmp.Close()
		return "", fmt.Errorf("chmod: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("install %s: %w", dst, err)
	}
	return dst, nil
}
