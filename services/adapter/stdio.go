package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"

	"github.com/v0m3/v0m3/internal/reach"
	"github.com/v0m3/v0m3/internal/stdionoise"
)

// childPATH is the PATH a local server gets unless its configuration sets
// one. Nothing else of the adapter's environment reaches it.
const childPATH = "/usr/local/bin:/usr/bin:/bin"

// stopGrace is how long a local server may take to exit after its stdin
// closes before it is killed.
const stopGrace = 2 * time.Second

// stdioDialer starts a connection's local server as a child process and
// speaks MCP over its stdin/stdout. The child runs in a fresh working
// directory of its own under the connection's directory, with only its
// configured environment (plus the resolved credential, if the connection
// has one), under the sandbox sx applies (its own identity, process group,
// network namespace and limits; see sandboxer.start), and is always
// reaped, with everything it left running. After open, sandbox holds the
// constraints actually applied.
type stdioDialer struct {
	spec          *registryv1.StdioTransport
	workRoot      string
	connectionID  string
	credentialRef string
	creds         *credentials
	reach         reach.Policy
	sx            *sandboxer
	log           *slog.Logger
	// starts and live count the processes started and not yet reaped.
	starts, live *atomic.Int64

	sandbox *registryv1.SandboxConstraints
}

func (d *stdioDialer) open(ctx context.Context, m *meter) (mcp.Transport, func(), error) {
	env := childEnv(d.spec.GetEnv())
	path, err := lookPath(d.spec.GetCommand(), envValue(env, "PATH"))
	if err != nil {
		return nil, nil, err
	}
	// Nothing starts unless the platform allows the executable; what runs
	// is the resolved file that was checked, not a symlink to it.
	if path, err = d.reach.CheckExecutable(path); err != nil {
		return nil, nil, err
	}
	for name := range d.spec.GetEnv() {
		if err := reach.CheckEnvName(name); err != nil {
			return nil, nil, err
		}
	}
	secret, err := d.creds.resolve(d.credentialRef)
	if err != nil {
		return nil, nil, err
	}
	if secret != "" {
		env = withEnv(env, CredentialEnv, secret)
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("stdin pipe: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll(inR, inW)
		return nil, nil, fmt.Errorf("stdout pipe: %w", err)
	}
	connDir := filepath.Join(d.workRoot, safeName(d.connectionID))
	child, sb, err := d.sx.start(launchSpec{
		path:    path,
		args:    append([]string{d.spec.GetCommand()}, d.spec.GetArgs()...),
		env:     env,
		connID:  d.connectionID,
		connDir: connDir,
		stdin:   inR,
		stdout:  outW,
	})
	if err != nil {
		closeAll(inR, inW, outR, outW)
		// The error names the executable only: env (and the credential
		// in it) never enters an error.
		return nil, nil, fmt.Errorf("start %s: %w", filepath.Base(path), errnoOnly(err))
	}
	cmd := child.cmd
	if d.starts != nil {
		d.starts.Add(1)
		d.live.Add(1)
	}
	// The working directory recorded is the connection's own directory:
	// every run gets a fresh one inside it.
	sb.WorkingDir = connDir
	sb.MinimalEnvironment = true
	d.sandbox = sb
	// The child holds its own ends now.
	closeAll(inR, outW)
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	w := &watchWriter{w: inW, m: m}
	m.abortWrite = w.abortBlocked
	t := &mcp.IOTransport{
		// The client library's Close does not close stdout (release
		// does, once the server is gone): see release.
		Reader:        &lineLimitReader{r: d.noiseFilter(io.NopCloser(outR), m), m: m},
		Writer:        w,
		MaxLineLength: -1, // lineLimitReader enforces the limit while reading
	}
	release := func() {
		// Closing stdin asks the server to exit. Its stdout stays open,
		// and is drained, until it has: a server still answering (the
		// call it was just told is cancelled, say) neither blocks on a
		// full pipe nor dies of a broken one (a Go server is killed by
		// SIGPIPE writing to a closed stdout) before it has handled what
		// it read before the end of its stdin, notifications/cancelled
		// included.
		_ = inW.Close()
		go func() { _, _ = io.Copy(io.Discard, outR) }()
		select {
		case <-exited:
		case <-time.After(stopGrace):
			d.log.Warn("local server did not exit after stdin closed; killing it", "connection_id", d.connectionID)
		}
		killGroup(cmd)
		<-exited
		// A process the server left holding stdout died with its group:
		// the drain ends.
		_ = outR.Close()
		child.done()
		if d.live != nil {
			d.live.Add(-1)
		}
	}
	return t, release, nil
}

// errnoOnly reduces a start error to its errno when it has one, so no part
// of the command's configuration is carried along.
func errnoOnly(err error) error {
	var se *sandboxError
	if errors.As(err, &se) {
		return se
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return errors.New("could not start")
}

// withEnv sets key=value in env (sorted KEY=VALUE list), replacing any
// configured value.
func withEnv(env []string, key, value string) []string {
	out := slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == key
	})
	out = append(out, key+"="+value)
	slices.Sort(out)
	return out
}

// childEnv is the child's whole environment: PATH plus the configured,
// non-secret variables, sorted.
func childEnv(cfg map[string]string) []string {
	env := map[string]string{"PATH": childPATH}
	for k, v := range cfg {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// lookPath resolves command against the child's PATH, not the adapter's.
func lookPath(command, path string) (string, error) {
	if command == "" {
		return "", fmt.Errorf("no command configured")
	}
	if strings.Contains(command, "/") {
		return command, nil
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, command)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q not found in the server's PATH", command)
}

// safeName maps an id onto a file name.
func safeName(id string) string {
	b := []byte(id)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "_"
	}
	return string(b)
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// watchWriter writes outbound messages to the child's stdin and tells the
// meter once the watched request was written whole.
type watchWriter struct {
	w *os.File
	m *meter

	mu sync.Mutex
	// writing is the kind of write in progress, if any.
	writing writeKind
	// deadline: a write deadline is set on w (by abortBlocked, or for a
	// cancellation notice) and must be cleared before the next message.
	deadline bool
	// cut: a write failed, possibly part-way through a message; the
	// stream is unusable and every later write fails at once.
	cut bool
}

// writeKind tells abortBlocked which writes it may end.
type writeKind int

const (
	writeNone writeKind = iota
	// writeMessage is any message but a cancellation notice.
	writeMessage
	// writeNotice is a notifications/cancelled: it is bounded by its own
	// deadline (cancelNoticeWait), never ended by the call it announces
	// giving up, or the server would never hear it.
	writeNotice
)

// errCallGaveUp refuses the request of a call that gave up before it was
// written.
var errCallGaveUp = errors.New("stdio: the call gave up before its request was written")

// errStreamCut is returned by every write after one failed.
var errStreamCut = errors.New("stdio: an earlier write to the server failed; the stream is unusable")

func (w *watchWriter) Write(p []byte) (int, error) {
	// The call is bound to its request id before the first byte goes
	// out: its response may arrive before Write returns.
	c := w.m.bind(p)
	var (
		notice   json.RawMessage
		isNotice bool
	)
	if c == nil {
		notice, isNotice = cancelNotice(p)
	}
	if err := w.begin(c, isNotice); err != nil {
		return 0, err
	}
	n, err := w.w.Write(p)
	w.end(err)
	switch {
	case err != nil:
		if c != nil && n == len(p)-1 && p[n] == '\n' {
			// Cut before its newline only: the whole request reached the
			// server, and one that parses JSON without waiting for the
			// newline, or a line reader flushing its last line at end of
			// input, may act on it. It was sent; any shorter cut leaves
			// JSON no server can take for a request.
			c.markSent()
		}
	case c != nil:
		c.markSent()
	case isNotice:
		w.m.cancelWritten(notice)
	}
	return n, err
}

// begin marks a write of the given kind in progress, with the deadline it
// needs. c is the call whose request it is, if any.
func (w *watchWriter) begin(c *callMeter, notice bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cut {
		return errStreamCut
	}
	if c != nil && c.gaveUp.Load() {
		// The call gave up while its request waited behind another
		// write: the server never gets it, and the stream stays whole.
		return errCallGaveUp
	}
	switch {
	case notice:
		_ = w.w.SetWriteDeadline(time.Now().Add(cancelNoticeWait))
		w.deadline = true
	case w.deadline:
		// Left by abortBlocked after its write had completed, or by a
		// notice: this message has none.
		_ = w.w.SetWriteDeadline(time.Time{})
		w.deadline = false
	}
	w.writing = writeMessage
	if notice {
		w.writing = writeNotice
	}
	return nil
}

// end marks the write in progress finished with err.
func (w *watchWriter) end(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writing = writeNone
	if err != nil {
		w.cut = true
	}
}

func (w *watchWriter) Close() error { return w.w.Close() }

// abortBlocked is called when the call gaveUp gives up. Its request, if
// not yet written, never is: a call queued behind another write does not
// reach the server after giving up. And it ends the message write in
// progress, if any: a server that stops reading its stdin blocks a write
// once the pipe is full, and the client library's write heeds no context,
// so without this a call's deadline would not end it (nor free the calls
// queued behind that write). A message cut short leaves the stream
// unusable: the session breaks, and serves no other call. A cancellation
// notice in progress is left to its own deadline: it is how the server
// learns that the call was given up.
func (w *watchWriter) abortBlocked(gaveUp *callMeter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	gaveUp.gaveUp.Store(true)
	if w.writing == writeMessage {
		_ = w.w.SetWriteDeadline(time.Now())
		w.deadline = true
	}
}

// noiseFilter drops the non-JSON lines the local server prints on stdout
// (banners, log lines some community servers print): they still count in
// the meter's total, and the first few are logged with the connection's
// credential scrubbed, since they are untrusted text.
func (d *stdioDialer) noiseFilter(stdout io.ReadCloser, m *meter) *stdionoise.Filter {
	return stdionoise.New(stdout, stdionoise.Options{
		Log:   d.log.With("connection_id", d.connectionID),
		Scrub: d.creds.text,
		Count: func(n int) { m.total.Add(int64(n)) },
	})
}
