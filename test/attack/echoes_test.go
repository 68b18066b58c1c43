package attack_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/serve"
	"github.com/v0m3/v0m3/internal/stranger"
	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/suite"
)

// Attacker-sized values: what the first probe sent, and ones under the
// header bound that reach a handler, so what it echoes and logs shows.
var (
	hugeHost = strings.Repeat("h", 500_000)
	hugePath = "/tasks/" + strings.Repeat("p", 60_000) + "/mcp"
	longHost = strings.Repeat("h", 8_000) + ".example"
	longPath = "/tasks/" + strings.Repeat("p", 8_000) + "/mcp"
)

// maxAnswer bounds the body of any refusal a stranger gets: a fixed
// message with at most one clipped value.
const maxAnswer = 2 * (stranger.EchoBytes + 256)

// maxLine bounds one log line about a stranger: a few clipped values.
const maxLine = 6 * (stranger.EchoBytes + 64)

// strangerProbe is one request a stranger sends.
type strangerProbe struct {
	name   string
	method string
	host   string
	path   string
	header map[string]string
	// want is the status it gets.
	want int
}

// send sends p to base and returns the status and body, read whole (a
// bounded body is small; an unbounded one is measured).
func (p strangerProbe) send(t *testing.T, client *http.Client, base string) (int, []byte) {
	t.Helper()
	method := p.method
	if method == "" {
		method = http.MethodPost
	}
	req, err := http.NewRequest(method, base+p.path, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.host != "" {
		req.Host = p.host
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range p.header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: read the answer: %v", p.name, err)
	}
	return resp.StatusCode, body
}

// checkBounded sends every probe, then a burst of n of the last one, and
// checks each answer's status and size, each new log line's size, and
// that the burst was logged at most at the refusal log's rate.
func checkBounded(t *testing.T, client *http.Client, base string, logs *testkit.SyncBuffer, probes []strangerProbe, burst int) {
	t.Helper()
	offset := len(logs.String())
	for _, p := range probes {
		code, body := p.send(t, client, base)
		// An ordinary answer (metrics) is the surface's own; refusals are
		// what a stranger's request could size.
		if code != p.want || (code != http.StatusOK && len(body) > maxAnswer) {
			t.Errorf("%s: %d with a %d-byte body, want %d and at most %d bytes: %.300q", p.name, code, len(body), p.want, maxAnswer, body)
		}
	}
	start := time.Now()
	last := probes[len(probes)-1]
	for range burst {
		if code, body := last.send(t, client, base); code != last.want || (code != http.StatusOK && len(body) > maxAnswer) {
			t.Fatalf("burst of %s: %d with a %d-byte body", last.name, code, len(body))
		}
	}
	elapsed := time.Since(start)
	written := logs.String()[offset:]
	lines := strings.Split(strings.TrimSpace(written), "\n")
	refusals := 0
	for _, l := range lines {
		if len(l) > maxLine {
			t.Errorf("a %d-byte log line about a stranger (at most %d): %.300s…", len(l), maxLine, l)
		}
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && strings.Contains(m["msg"].(string), "refused") {
			refusals++
		}
	}
	// The token bucket allows its burst, then its rate over the time the
	// flood took; never a line per request.
	allowed := stranger.RefusalBurst + int(math.Ceil(elapsed.Seconds()*stranger.RefusalRate)) + 1
	if refusals > allowed || refusals >= len(probes)+burst {
		t.Errorf("%d refusals were logged in %d lines for %d requests in %s; at most %d may be", refusals, len(lines), len(probes)+burst, elapsed, allowed)
	}
	if max := (allowed + 10) * maxLine; len(written) > max {
		t.Errorf("%d requests wrote %d bytes of log, want at most %d", len(probes)+burst, len(written), max)
	}
}

// TestTaskEndpointBoundsEchoes: the first probe's 500 KB Host header and
// 60 KB path at the task MCP endpoint, and values just under the header
// bound that reach its handler: every answer is a small fixed refusal
// (431 past the bound, 403 for a foreign host with the host clipped, 401
// for a token that opens nothing), each log line is clipped, and a burst
// of 100 refusals is logged at the refusal log's rate. Nothing is created.
func TestTaskEndpointBoundsEchoes(t *testing.T) {
	t.Parallel()
	logs := &testkit.SyncBuffer{}
	s, err := suite.Start(context.Background(), suite.Config{
		DataDir: t.TempDir(), MCP: &suite.MCP{}, Log: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	creds, err := s.Credentials(suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: creds.Roots(), MinVersion: tls.VersionTLS13}}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	bearer := map[string]string{"Authorization": "Bearer v0m3tt_" + strings.Repeat("x", 43)}
	checkBounded(t, client, s.MCPURL, logs, []strangerProbe{
		{name: "500 KB Host", host: hugeHost, path: "/tasks/task_x/mcp", want: http.StatusRequestHeaderFieldsTooLarge},
		{name: "60 KB path", path: hugePath, header: bearer, want: http.StatusRequestHeaderFieldsTooLarge},
		{name: "8 KB path with a token", path: longPath, header: bearer, want: http.StatusUnauthorized},
		{name: "8 KB Origin", path: "/tasks/task_x/mcp", header: map[string]string{"Origin": "https://" + longHost}, want: http.StatusForbidden},
		{name: "8 KB Host", host: longHost, path: "/tasks/task_x/mcp", want: http.StatusForbidden},
	}, 100)
	tasks, err := s.Orchestrator.ListTasks(s.As(context.Background(), "ada", "auditors"), &orchestratorv1.ListTasksRequest{PageSize: 1000})
	if err != nil || len(tasks.GetTasks()) != 0 {
		t.Fatalf("tasks after the attack: %v, %v", tasks, err)
	}
}

// TestBridgeBoundsEchoes: the same strangers at `v0m3 bridge`, the real
// binary serving a stdio server over HTTP with no authentication at all:
// bounded answers, clipped and rate-bounded log lines, and no child
// started for any of them.
func TestBridgeBoundsEchoes(t *testing.T) {
	t.Parallel()
	logs := &testkit.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, v0m3Bin, "bridge", "--listen", "127.0.0.1:0", "--", fixtureBin, "--transport", "stdio")
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	var addr string
	testkit.Eventually(t, "the bridge serving", func() bool {
		out := logs.String()
		for _, l := range strings.Split(out, "\n") {
			var m struct{ Msg, Addr string }
			if json.Unmarshal([]byte(l), &m) == nil && m.Msg == "bridge serving" {
				addr = m.Addr
				return true
			}
		}
		return false
	})
	client := &http.Client{}
	t.Cleanup(client.CloseIdleConnections)
	checkBounded(t, client, "http://"+addr, logs, []strangerProbe{
		{name: "500 KB Host", host: hugeHost, path: "/mcp", want: http.StatusRequestHeaderFieldsTooLarge},
		{name: "60 KB path", path: "/mcp" + strings.Repeat("p", 60_000), want: http.StatusRequestHeaderFieldsTooLarge},
		{name: "8 KB protocol version", path: "/mcp", header: map[string]string{"Mcp-Protocol-Version": strings.Repeat("v", 8_000)}, want: http.StatusBadRequest},
		{name: "8 KB Origin", path: "/mcp", header: map[string]string{"Origin": "https://" + longHost}, want: http.StatusForbidden},
		{name: "8 KB Host", host: longHost, path: "/mcp", want: http.StatusForbidden},
	}, 100)
	out := logs.String()
	if strings.Contains(out, "session started") {
		t.Fatal("a stranger's request started a child")
	}
}

// TestMetricsAndHealthBoundHeaders: the metrics endpoint (the real
// listener every service command serves) answers a 500 KB Host header or
// a 60 KB path with a small 431 before any handler reads it, and gRPC
// health (which answers anyone) refuses a 500 KB metadata header instead
// of reading it; neither logs anything of it.
func TestMetricsAndHealthBoundHeaders(t *testing.T) {
	t.Parallel()
	logs := &testkit.SyncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	addr, err := serve.Metrics(ctx, "127.0.0.1:0", log)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{}
	t.Cleanup(client.CloseIdleConnections)
	checkBounded(t, client, "http://"+addr.String(), logs, []strangerProbe{
		{name: "ordinary scrape", method: http.MethodGet, path: "/metrics?x=" + strings.Repeat("q", 100), want: http.StatusOK},
		{name: "500 KB Host", method: http.MethodGet, host: hugeHost, path: "/metrics", want: http.StatusRequestHeaderFieldsTooLarge},
		{name: "60 KB path", method: http.MethodGet, path: "/" + strings.Repeat("p", 60_000), want: http.StatusRequestHeaderFieldsTooLarge},
	}, 40)

	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	conn, err := serve.Dial(s.Addr[suite.Orchestrator], s.CallerDialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	health := healthpb.NewHealthClient(conn)
	if r, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("an ordinary health check: %v, %v", r, err)
	}
	offset := len(logs.String())
	for range 40 {
		_, err = health.Check(metadata.AppendToOutgoingContext(ctx, "x-stranger", strings.Repeat("m", 500_000)), &healthpb.HealthCheckRequest{})
		// The server advertises its bound (SETTINGS_MAX_HEADER_LIST_SIZE),
		// so the call is refused before a byte of it is read.
		if c := status.Code(err); c != codes.Internal && c != codes.ResourceExhausted {
			t.Fatalf("a health check with 500 KB of metadata: %v, want it refused", err)
		}
	}
	if written := logs.String()[offset:]; len(written) > 40*maxLine/4 {
		t.Errorf("health checks with 500 KB of metadata logged %d bytes", len(written))
	}
}
