// Package redistest starts a private redis-server for a test: on a free
// loopback port, with its data in a temporary directory, configured the way
// the Helm chart configures production (AOF, fsync every second, no RDB
// snapshots), and stopped when the test ends. Tests never share a server
// with a developer's own Redis.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/v0m3/v0m3/internal/testkit"
)

// InstallCommand is what makes redis-server available on Debian/Ubuntu.
const InstallCommand = "apt-get install -y redis-server"

// Server is one redis-server process owned by a test. Stop and Start may be
// called any number of times; the data directory and port stay the same,
// so a restart finds what the append-only file holds.
type Server struct {
	// Addr is host:port of the server.
	Addr string

	bin  string
	dir  string
	port int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts a redis-server for t and returns its address and a function
// that stops it (also called on t's cleanup). Without redis-server on PATH
// the test is skipped, or fails when the CI environment variable is set.
func Start(t testing.TB) (addr string, stop func()) {
	s := StartServer(t)
	return s.Addr, func() { _ = s.Stop() }
}

// StartServer is Start returning the Server, for tests that restart Redis.
func StartServer(t testing.TB) *Server {
	t.Helper()
	testkit.NeedsExternal(t, "redis-server (make redis)")
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		msg := "redis-server is not installed; install it with: sudo " + InstallCommand
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPING REDIS TESTS: " + msg)
	}
	port := testkit.ListenLoopback(t)
	port.Close()
	s := &Server{bin: bin, dir: t.TempDir(), port: port.Addr().(*net.TCPAddr).Port, Addr: port.Addr().String()}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return s
}

// Dir is the server's data directory.
func (s *Server) Dir() string { return s.dir }

// Start starts the server if it is not running and waits until it answers
// PING. A port taken in the meantime by another process fails the start.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	cmd := exec.Command(s.bin,
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--dir", s.dir, "--appendonly", "yes", "--appendfsync", "everysec",
		"--save", "", "--protected-mode", "yes", "--daemonize", "no",
		"--logfile", "redis.log")
	cmd.Dir = s.dir
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done

	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := ping(s.Addr, cmd.Process.Pid); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			s.stopLocked(syscall.SIGKILL)
			return fmt.Errorf("redistest: redis-server on %s did not answer PING: %w (log: %s)", s.Addr, err, s.logTail())
		}
		select {
		case <-done:
			s.cmd, s.done = nil, nil
			return fmt.Errorf("redistest: redis-server exited at start (log: %s)", s.logTail())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop shuts the server down gracefully (SIGTERM: Redis flushes and fsyncs
// the append-only file, as in a rolling restart) and waits for it to exit.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(syscall.SIGTERM)
}

// Kill stops the server abruptly (SIGKILL), as a crash would. With
// appendfsync everysec, Redis may still hold the last writes in memory
// (it postpones writing the append-only file for up to 2 s while an fsync
// is slow, as under load), and a crash loses them, in production too: a
// test whose writes must survive the crash calls Sync first.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(syscall.SIGKILL)
}

// Sync makes every write the server acknowledged so far durable in its
// append-only file, as a test needs before Kill when the writes must
// survive: a write under appendfsync always flushes and fsyncs everything
// before it (Redis 7.0 has no WAITAOF).
func (s *Server) Sync(t testing.TB) {
	t.Helper()
	c := Client(t, s.Addr)
	ctx := context.Background()
	for _, err := range []error{
		c.ConfigSet(ctx, "appendfsync", "always").Err(),
		c.Set(ctx, "redistest:sync", time.Now().UnixNano(), 0).Err(),
		c.ConfigSet(ctx, "appendfsync", "everysec").Err(),
	} {
		if err != nil {
			t.Fatalf("redistest: sync the append-only file: %v", err)
		}
	}
}

// Restart stops the server gracefully and starts it again on the same
// directory and port.
func (s *Server) Restart() error {
	if err := s.Stop(); err != nil {
		return err
	}
	return s.Start()
}

func (s *Server) stopLocked(sig syscall.Signal) error {
	if s.cmd == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd, s.done = nil, nil
	return nil
}

func (s *Server) logTail() string {
	b, err := os.ReadFile(s.dir + "/redis.log")
	if err != nil {
		return err.Error()
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// ping sends inline PING and INFO commands with no client library, so the
// helper depends on nothing the code under test uses. It succeeds when the
// server answers and is the process with the given pid.
func ping(addr string, pid int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return errors.New("unexpected reply " + strconv.Quote(line))
	}
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return err
	}
	head, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if err != nil {
		return errors.New("unexpected INFO reply " + strconv.Quote(head))
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	if !strings.Contains(string(body), "process_id:"+strconv.Itoa(pid)+"\r\n") {
		return fmt.Errorf("port %s is served by another process", addr)
	}
	return nil
}
