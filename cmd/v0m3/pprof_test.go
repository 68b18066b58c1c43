package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer written by a command while a test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startDev runs `v0m3 dev` with args on ephemeral ports until the test
// ends, and returns what it printed once it serves.
func startDev(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"dev", "--port-base", "0", "--data-dir", t.TempDir(), "--log-level", "error"}, args...), &out, &bytes.Buffer{})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("v0m3 dev: %v", err)
		}
	})
	for !strings.Contains(out.String(), "serving until interrupted") {
		select {
		case err := <-done:
			t.Fatalf("v0m3 dev ended: %v\n%s", err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return out.String()
}

// Runtime profiles are off unless --pprof asks for them; then they are
// served on their own loopback listener, and only a loopback address is
// accepted.
func TestPprofOffByDefault(t *testing.T) {
	t.Parallel()
	if out := startDev(t); strings.Contains(out, "pprof") {
		t.Fatalf("v0m3 dev serves profiles without --pprof:\n%s", out)
	}

	out := startDev(t, "--pprof", "127.0.0.1:0")
	m := regexp.MustCompile(`pprof\s+(http://\S+/debug/pprof/)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("v0m3 dev --pprof did not say where profiles are:\n%s", out)
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d", m[1], resp.StatusCode)
	}

	err = run(t.Context(), []string{"registry", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--insecure-plaintext", "--pprof", "0.0.0.0:0"}, &bytes.Buffer{}, &bytes.Buffer{})
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("registry --pprof 0.0.0.0:0 = %v, want a usage error asking for a loopback address", err)
	}
}
