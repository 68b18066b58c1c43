package stranger_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/v0m3/v0m3/internal/stranger"
)

func TestClipN(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		n        int
		want     string
	}{
		{"short stays whole", "abc", 5, "abc"},
		{"exact stays whole", "abcde", 5, "abcde"},
		{"long is cut and marked", "abcdefgh", 5, "abcde…[3 bytes cut]"},
		{"never splits a character", "aé" + "bc", 2, "a…[4 bytes cut]"},
		{"zero keeps only the mark", "abc", 0, "…[3 bytes cut]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := stranger.ClipN(tc.in, tc.n)
			if got != tc.want || !utf8.ValidString(got) {
				t.Fatalf("ClipN(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
			}
		})
	}
	if got := stranger.Clip(strings.Repeat("x", 500_000)); len(got) > stranger.EchoBytes+32 {
		t.Fatalf("Clip of 500 KB is %d bytes", len(got))
	}
}

type stringer string

func (s stringer) String() string { return string(s) }

func TestClipAttrs(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("h", 60_000)
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	log.Info("x", stranger.ClipAttrs("host", big, "err", errors.New(big), "n", 3, slog.String("attr", big),
		"who", stringer(big), "raw", []byte(big), slog.Group("g", slog.String("inner", big)), big)...)
	if buf.Len() > 8*stranger.EchoBytes+400 {
		t.Fatalf("a line of clipped attributes is %d bytes: %s", buf.Len(), buf.String()[:500])
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if m["n"] != float64(3) || !strings.HasSuffix(m["host"].(string), "[59744 bytes cut]") {
		t.Fatalf("line = %v", m)
	}
}

// TestRefusalsBurstThenCount: a flood logs a burst, then nothing, and the
// next line logged after the bucket refills says how many went unlogged.
func TestRefusalsBurstThenCount(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	now := time.Unix(1_000_000, 0)
	r := &stranger.Refusals{Log: slog.New(slog.NewJSONHandler(&buf, nil)), Burst: 3, Rate: 1, Now: func() time.Time { return now }}
	ctx := context.Background()
	for i := range 100 {
		r.Warn(ctx, "refused", "host", strings.Repeat("h", 10_000), "i", i)
	}
	lines := splitLines(t, &buf)
	if len(lines) != 3 {
		t.Fatalf("100 refusals logged %d lines, want the burst of 3", len(lines))
	}
	if buf.Len() > 3*(stranger.EchoBytes+200) {
		t.Fatalf("3 lines are %d bytes", buf.Len())
	}
	now = now.Add(time.Second)
	buf.Reset()
	r.Info(ctx, "refused")
	lines = splitLines(t, &buf)
	if len(lines) != 1 || lines[0]["unlogged_before"] != float64(97) {
		t.Fatalf("the line after the flood: %v, want unlogged_before 97", lines)
	}
	var nilLog stranger.Refusals
	nilLog.Warn(ctx, "nothing") // a zero Refusals logs nothing and does not fail
}

func splitLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(buf.Bytes()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// TestHTTPServerBoundsHeaders: a request line or header past
// MaxHeaderBytes gets 431 from net/http, and the handler never runs.
func TestHTTPServerBoundsHeaders(t *testing.T) {
	t.Parallel()
	ran := make(chan string, 4)
	srv := stranger.HTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran <- r.URL.Path }))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	for _, tc := range []struct {
		name string
		req  func(*http.Request)
		want int
	}{
		{"ordinary", func(*http.Request) {}, http.StatusOK},
		{"500 KB Host", func(r *http.Request) { r.Host = strings.Repeat("h", 500_000) }, http.StatusRequestHeaderFieldsTooLarge},
		{"60 KB path", func(r *http.Request) { r.URL.Path = "/" + strings.Repeat("p", 60_000) }, http.StatusRequestHeaderFieldsTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/ok", l.Addr()), nil)
			if err != nil {
				t.Fatal(err)
			}
			tc.req(req)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
	if len(ran) != 1 {
		t.Fatalf("the handler ran %d times, want once (the ordinary request)", len(ran))
	}
}
