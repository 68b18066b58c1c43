package serve_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/v0m3/v0m3/internal/serve"
)

// Profiles are served on a loopback address only: any other address is
// refused before anything listens.
func TestProfilingRefusesNonLoopback(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.1:0", "example.com:0", "nonsense"} {
		t.Run(addr, func(t *testing.T) {
			t.Parallel()
			a, err := serve.Profiling(t.Context(), addr, slog.New(slog.DiscardHandler))
			if err == nil {
				t.Fatalf("Profiling(%q) = %v, want a refusal", addr, a)
			}
		})
	}
}

// On loopback the profiles answer, and stop when ctx ends.
func TestProfilingServesOnLoopback(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	addr, err := serve.Profiling(ctx, "127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr.String() + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine") {
		t.Fatalf("goroutine profile: %d %q", resp.StatusCode, body)
	}
	cancel()
	// Closed with ctx: a new connection is refused (eventually; Close is
	// asynchronous to cancel).
	for {
		c, err := net.Dial("tcp", addr.String())
		if err != nil {
			break
		}
		c.Close()
	}
}
