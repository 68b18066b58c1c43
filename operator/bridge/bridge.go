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
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Options configures a Bridge.
type Options struct {
	// Command is the server's executable and arguments. Required.
	Command []string
	// Env is the child's environment; nil inherits the bridge's (in a pod,
	// exactly what the MCPServer's spec set).
	Env []string
	// Dir is the child's working directory; "" inherits the bridge's.
	Dir string
	// MaxSessions bounds concurrent sessions, and so child processes.
	// Zero means 16.
	MaxSessions int
	// Log receives structured logs; nil discards them.
	Log *slog.Logger
	// Stderr receives the children's stderr; nil uses os.Stderr.
	Stderr io.Writer
}

// Bridge is an http.Handler serving one MCP endpoint.
type Bridge struct {
	opts Options

	mu       sync.Mutex
	sessions map[string]*session
	closed   bool
}

// session is one HTTP session and the child process serving it.
type session struct {
	transport *mcp.StreamableServerTransport
	cancel    context.CancelFunc
	done      chan struct{}
}

// New returns a Bridge. Close it to stop every child.
func New(opts Options) (*Bridge, error) {
	if len(opts.Command) == 0 || opts.Command[0] == "" {
		return nil, errors.New("bridge: a command is required")
	}
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = 16
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	return &Bridge{opts: opts, sessions: map[string]*session{}}, nil
}

// ServeHTTP implements MCP streamable HTTP: a POST without a session id
// starts a session (and a child); later requests carry its id.
func (b *Bridge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("Mcp-Session-Id")
	switch {
	case r.Method == http.MethodDelete:
		if s := b.lookup(id); s != nil {
			b.end(id, s)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		http.Error(w, "session not found", http.StatusNotFound)
	case r.Method != http.MethodGet && r.Method != http.MethodPost:
		w.Header().Set("Allow", "GET, POST, DELETE")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	case id != "":
		s := b.lookup(id)
		if s == nil {
			http.Error(w, "session not found", http.StatusNotFound)
			return
		}
		s.transport.ServeHTTP(w, r)
	case r.Method == http.MethodGet:
		http.Error(w, "a GET needs an Mcp-Session-Id", http.StatusBadRequest)
	default:
		// Only initialize starts a session: anything else without a session
		// id (e.g. a stateless server/discover probe) would start a child
		// that nobody can address again. Clients fall back to initialize.
		if !startsSession(r) {
			http.Error(w, "Bad Request: this bridge serves stateful sessions; start one with initialize", http.StatusBadRequest)
			return
		}
		s, status, err := b.start()
		if err != nil {
			http.Error(w, err.Error(), status)
			return
		}
		s.transport.ServeHTTP(w, r)
	}
}

// maxInitializeBody bounds the initialize request the bridge reads to
// decide whether to start a session.
const maxInitializeBody = 1 << 20

// startsSession reports whether the POST body is an initialize request,
// leaving the body readable for the transport.
func startsSession(r *http.Request) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxInitializeBody))
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return false
	}
	var msg struct {
		Method string `json:"method"`
	}
	return json.Unmarshal(body, &msg) == nil && msg.Method == "initialize"
}

func (b *Bridge) lookup(id string) *session {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sessions[id]
}

// start creates a session and its child process.
func (b *Bridge) start() (*session, int, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, http.StatusServiceUnavailable, errors.New("bridge is shutting down")
	}
	if len(b.sessions) >= b.opts.MaxSessions {
		b.mu.Unlock()
		return nil, http.StatusServiceUnavailable, fmt.Errorf("too many sessions (%d); close one and retry", b.opts.MaxSessions)
	}
	id := rand.Text()
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{transport: &mcp.StreamableServerTransport{SessionID: id}, cancel: cancel, done: make(chan struct{})}
	b.sessions[id] = s
	b.mu.Unlock()

	fail := func(err error) (*session, int, error) {
		b.end(id, s)
		b.opts.Log.Error("start session", "session", id, "err", err)
		return nil, http.StatusBadGateway, errors.New("the MCP server could not be started")
	}
	httpConn, err := s.transport.Connect(ctx)
	if err != nil {
		return fail(err)
	}
	cmd := exec.CommandContext(ctx, b.opts.Command[0], b.opts.Command[1:]...)
	cmd.Env, cmd.Dir, cmd.Stderr = b.opts.Env, b.opts.Dir, b.opts.Stderr
	childConn, err := (&mcp.CommandTransport{Command: cmd}).Connect(ctx)
	if err != nil {
		httpConn.Close()
		return fail(err)
	}
	b.opts.Log.Info("session started", "session", id, "pid", cmd.Process.Pid)

	var once sync.Once
	stop := func() {
		once.Do(func() {
			httpConn.Close()
			childConn.Close()
			b.end(id, s)
			close(s.done)
		})
	}
	go relay(ctx, httpConn, childConn, stop)
	go relay(ctx, childConn, httpConn, stop)
	return s, 0, nil
}

// relay copies messages from one side to the other until either fails.
func relay(ctx context.Context, from, to mcp.Connection, stop func()) {
	defer stop()
	for {
		msg, err := from.Read(ctx)
		if err != nil {
			return
		}
		if err := to.Write(ctx, msg); err != nil {
			return
		}
	}
}

// end forgets a session and stops its child.
func (b *Bridge) end(id string, s *session) {
	b.mu.Lock()
	if b.sessions[id] == s {
		delete(b.sessions, id)
	}
	b.mu.Unlock()
	s.cancel()
}

// Close ends every session and stops their children.
func (b *Bridge) Close() {
	b.mu.Lock()
	b.closed = true
	all := b.sessions
	b.sessions = map[string]*session{}
	b.mu.Unlock()
	for _, s := range all {
		s.cancel()
	}
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
