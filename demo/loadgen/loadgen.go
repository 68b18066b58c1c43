// Package loadgen measures what a governed tool call costs beside a direct
// one (issue 14), for `v0m3 bench`. It runs the real system: the five
// services as one `v0m3 dev` child process on the file store or on a
// private redis-server, and the fixture MCP server over streamable HTTP (a
// child process) or stdio (started by a go-sdk client directly, or by the
// adapter, as a grandchild of the bench).
//
// Each cell of the measurement is one store, one transport, one number of
// concurrent callers and one mode:
//
//   - direct: a go-sdk MCP client with one session, reused by every caller,
//     calls the fixture's search tool;
//   - governed: each caller is a product service with a task of its own
//     (source_review, started before the cell), and every call is a fresh
//     SubmitToolRequest for retrieve_authorized_source, mapped onto that
//     same search tool, with a new provider call id; it counts as
//     succeeded only when the request comes back executed with outcome ok.
//
// CPU per governed call is the CPU time of the `v0m3 dev` process alone
// (its own utime+stime from /proc, which leaves out the stdio server it
// starts, the bench and Redis), divided by the calls the cell made.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Stores, transports and modes a run may measure.
const (
	StoreFile      = "file"
	StoreRedis     = "redis"
	TransportHTTP  = "http"
	TransportStdio = "stdio"
	ModeDirect     = "direct"
	ModeGoverned   = "governed"
)

// Config says what to measure and how long.
type Config struct {
	// Exe is the v0m3 binary that runs the fixture server. Required.
	Exe string
	// System is the v0m3 binary run as `v0m3 dev`, the system under test;
	// "" means Exe. scripts/bench-compare.sh measures two builds with one
	// harness and one fixture this way, so only the system differs.
	System string
	// Stores, Transports and Callers span the cells: every combination is
	// measured, direct then governed.
	Stores     []string
	Transports []string
	Callers    []int
	// Duration is how long each cell is measured, when Calls is zero.
	Duration time.Duration
	// Calls, when positive, is the number of calls each cell makes (shared
	// by its callers) instead of a duration.
	Calls int
	// Warmup is how long every caller calls before a cell's measurement
	// starts (processes started, connections and caches warm); with Calls
	// each caller makes one warm-up call instead.
	Warmup time.Duration
	// WorkDir holds data directories and child logs; "" makes (and
	// removes) a temporary directory.
	WorkDir string
	// DevArgs are extra flags for `v0m3 dev` (e.g. a profiling flag).
	DevArgs []string
	// Progress receives one line per step; nil discards them.
	Progress io.Writer
}

// Cell is one measured combination.
type Cell struct {
	Store     string `json:"store"`
	Transport string `json:"transport"`
	Callers   int    `json:"callers"`
	Mode      string `json:"mode"`
	// Calls is the number of calls that succeeded; Failed those that did
	// not, by reason in Failures.
	Calls    int            `json:"calls"`
	Failed   int            `json:"failed"`
	Failures map[string]int `json:"failures,omitempty"`
	// Seconds is the measured wall time.
	Seconds float64 `json:"seconds"`
	// P50Ms and P99Ms are latency percentiles of the succeeded calls.
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	// CallsPerSec is succeeded calls per second.
	CallsPerSec float64 `json:"calls_per_sec"`
	// CPUMsPerCall is the `v0m3 dev` process's CPU per call (succeeded or
	// failed), governed cells only; RedisCPUMsPerCall is redis-server's
	// (Redis cells only).
	CPUMsPerCall      float64 `json:"cpu_ms_per_call,omitempty"`
	RedisCPUMsPerCall float64 `json:"redis_cpu_ms_per_call,omitempty"`
	// ServerCPUMsPerCall is the CPU per call of the stdio servers the
	// adapter started and reaped during the cell (the `v0m3 dev` process's
	// cutime+cstime): not V0M3's CPU, but the machine's, and what a process
	// start per call costs.
	ServerCPUMsPerCall float64 `json:"server_cpu_ms_per_call,omitempty"`
	// RatioToDirect is this governed cell's p50 over the direct cell's
	// p50 with the same store, transport and callers.
	RatioToDirect float64 `json:"ratio_to_direct,omitempty"`
}

// Key names the cell's combination, e.g. "file/http/32/governed".
func (c Cell) Key() string {
	return fmt.Sprintf("%s/%s/%d/%s", c.Store, c.Transport, c.Callers, c.Mode)
}

// Report is the result of one run.
type Report struct {
	Started   time.Time `json:"started"`
	CPUs      int       `json:"cpus"`
	Duration  string    `json:"cell_duration,omitempty"`
	CallsEach int       `json:"cell_calls,omitempty"`
	Cells     []Cell    `json:"cells"`
}

// Run measures every cell of cfg and returns the report. An error means
// the system could not be set up or driven; failed calls are counted in
// their cells, not returned.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Exe == "" {
		return nil, errors.New("loadgen: the v0m3 binary is required")
	}
	for _, s := range cfg.Stores {
		if s != StoreFile && s != StoreRedis {
			return nil, fmt.Errorf("loadgen: unknown store %q (want file or redis)", s)
		}
	}
	for _, t := range cfg.Transports {
		if t != TransportHTTP && t != TransportStdio {
			return nil, fmt.Errorf("loadgen: unknown transport %q (want http or stdio)", t)
		}
	}
	for _, n := range cfg.Callers {
		if n < 1 {
			return nil, fmt.Errorf("loadgen: callers must be at least 1, not %d", n)
		}
	}
	if cfg.Calls <= 0 && cfg.Duration <= 0 {
		return nil, errors.New("loadgen: give a duration or a number of calls per cell")
	}
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	dir := cfg.WorkDir
	if dir == "" {
		d, err := os.MkdirTemp("", "v0m3-bench-")
		if err != nil {
			return nil, fmt.Errorf("loadgen: %w", err)
		}
		defer os.RemoveAll(d)
		dir = d
	}
	// A root adapter runs a stdio server under a uid of its own, which
	// must reach the work files.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	_ = os.Chmod(dir, 0o755)
	rep := &Report{Started: time.Now().UTC(), CPUs: numCPU()}
	if cfg.Calls > 0 {
		rep.CallsEach = cfg.Calls
	} else {
		rep.Duration = cfg.Duration.String()
	}
	r := &runner{cfg: cfg, dir: dir, progress: progress}
	defer r.close()
	if slices.Contains(cfg.Transports, TransportHTTP) {
		fmt.Fprintln(progress, "bench: starting the fixture MCP server over streamable HTTP")
		proc, url, err := startHTTPFixture(ctx, cfg.Exe, dir)
		if err != nil {
			return nil, err
		}
		r.children = append(r.children, proc)
		r.fixtureURL = url
	}
	for _, store := range cfg.Stores {
		for _, transport := range cfg.Transports {
			cells, err := r.group(ctx, store, transport)
			if err != nil {
				return nil, fmt.Errorf("loadgen: %s store, %s transport: %w", store, transport, err)
			}
			rep.Cells = append(rep.Cells, cells...)
		}
	}
	return rep, nil
}

// runner holds what a run started.
type runner struct {
	cfg        Config
	dir        string
	progress   io.Writer
	fixtureURL string
	redis      *child
	redisAddr  string
	children   []*child
	groups     int
}

func (r *runner) close() {
	for i := len(r.children) - 1; i >= 0; i-- {
		r.children[i].stop()
	}
}

// group measures every callers count, direct then governed, on a fresh
// `v0m3 dev` for one store and transport.
func (r *runner) group(ctx context.Context, store, transport string) ([]Cell, error) {
	r.groups++
	dir := filepath.Join(r.dir, fmt.Sprintf("%d-%s-%s", r.groups, store, transport))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	storeURL := ""
	if store == StoreRedis {
		if r.redis == nil {
			fmt.Fprintln(r.progress, "bench: starting redis-server")
			proc, addr, err := startRedis(ctx, filepath.Join(r.dir, "redis"))
			if err != nil {
				return nil, err
			}
			r.children = append(r.children, proc)
			r.redis, r.redisAddr = proc, addr
		}
		// A prefix of its own per group: each group's system starts empty.
		storeURL = fmt.Sprintf("redis://%s/0?prefix=bench%d", r.redisAddr, r.groups)
	}
	fmt.Fprintf(r.progress, "bench: starting v0m3 dev on the %s store (%s transport)\n", store, transport)
	system := r.cfg.System
	if system == "" {
		system = r.cfg.Exe
	}
	// The adapter may start only the fixture binary over stdio (named
	// explicitly: the system's default roots hold its own binary, which
	// need not be the fixture's).
	devArgs := append([]string{"--stdio-roots", r.cfg.Exe}, r.cfg.DevArgs...)
	sys, err := startDev(ctx, system, dir, storeURL, devArgs)
	if err != nil {
		return nil, err
	}
	defer sys.close()
	tr := scenario.HTTPFixture(r.fixtureURL)
	if transport == TransportStdio {
		tr = scenario.StdioFixture(r.cfg.Exe)
	}
	if err := setUp(ctx, sys, tr); err != nil {
		return nil, err
	}
	direct, err := r.directSession(ctx, transport)
	if err != nil {
		return nil, err
	}
	defer direct.Close()

	var cells []Cell
	for _, n := range r.cfg.Callers {
		base := Cell{Store: store, Transport: transport, Callers: n}
		fmt.Fprintf(r.progress, "bench: %s/%s, %d caller(s): direct\n", store, transport, n)
		d := base
		d.Mode = ModeDirect
		if err := r.measure(ctx, &d, nil, n, func(ctx context.Context, _ int, _ int64) (string, error) {
			return directCall(ctx, direct)
		}); err != nil {
			return nil, err
		}
		fmt.Fprintf(r.progress, "bench: %s/%s, %d caller(s): governed\n", store, transport, n)
		callers, err := startTasks(ctx, sys, n)
		if err != nil {
			return nil, err
		}
		g := base
		g.Mode = ModeGoverned
		if err := r.measure(ctx, &g, sys, n, func(ctx context.Context, w int, seq int64) (string, error) {
			return governedCall(ctx, sys, callers[w], seq)
		}); err != nil {
			return nil, err
		}
		if d.P50Ms > 0 && g.Calls > 0 {
			g.RatioToDirect = g.P50Ms / d.P50Ms
		}
		cells = append(cells, d, g)
	}
	return cells, nil
}

// setUp connects the fixture, has it reviewed and discovered, and maps
// retrieve_authorized_source onto its search tool, each step by the person
// who takes it in the scenario.
func setUp(ctx context.Context, sys *devSystem, tr *registryv1.Transport) error {
	c := sys.clients
	integrator, err := sys.as(ctx, scenario.Integrator.ID, scenario.Integrator.Groups...)
	if err != nil {
		return err
	}
	reviewer, err := sys.as(ctx, scenario.Reviewer.ID, scenario.Reviewer.Groups...)
	if err != nil {
		return err
	}
	conn, err := c.Registry.CreateConnection(integrator, &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Sources", Owner: "platform-team", Transport: tr,
		CredentialScope: "read-only synthetic notes library; no credential",
	})
	if err != nil {
		return fmt.Errorf("create connection: %w", err)
	}
	conn, err = c.Registry.ReviewConnection(reviewer, &registryv1.ReviewConnectionRequest{
		ConnectionId: conn.GetId(), ConfigRevision: conn.GetConfigRevision(), Approve: true, Note: "bench",
	})
	if err != nil {
		return fmt.Errorf("review connection: %w", err)
	}
	snap, err := c.Adapter.Discover(integrator, &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		return fmt.Errorf("discover: %w", err)
	}
	m, err := c.Registry.ProposeMapping(integrator, &registryv1.ProposeMappingRequest{
		Capability: scenario.Retrieve, ConnectionId: conn.GetId(), SnapshotId: snap.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search"},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "query", ProductField: "query"},
			{RemoteField: "uri", ProductField: "source", FromHandle: true},
		},
		Limits: &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/markdown", "text/plain"}},
	})
	if err != nil {
		return fmt.Errorf("propose mapping: %w", err)
	}
	if _, err := c.Registry.ReviewMapping(reviewer, &registryv1.ReviewMappingRequest{MappingId: m.GetId(), Revision: m.GetRevision(), Approve: true, Note: "bench"}); err != nil {
		return fmt.Errorf("review mapping: %w", err)
	}
	return nil
}

// caller is one product caller of the governed cells: its authenticated
// context, its task and the handle of the source it retrieves.
type caller struct {
	token  string
	task   string
	handle string
}

// startTasks starts one source_review task per caller, each by an author
// of its own, and finds the handle of the migration FAQ in its catalogue.
func startTasks(ctx context.Context, sys *devSystem, n int) ([]caller, error) {
	out := make([]caller, n)
	for i := range out {
		tok, err := sys.token(fmt.Sprintf("bench-author-%d", i), "authors")
		if err != nil {
			return nil, err
		}
		actx := identity.WithBearer(ctx, tok)
		resp, err := sys.clients.Orchestrator.StartTask(actx, &orchestratorv1.StartTaskRequest{
			Profile: "source_review", Purpose: "benchmark the governed call",
			SourceScope: []*orchestratorv1.SourceRef{{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"}},
		})
		if err != nil {
			return nil, fmt.Errorf("start task: %w", err)
		}
		h := scenario.FindHandle(scenario.FindOffered(resp.GetCatalogue(), scenario.Retrieve), "Migration FAQ")
		if h == "" {
			return nil, fmt.Errorf("task %s was offered no handle for the Migration FAQ", resp.GetTask().GetId())
		}
		out[i] = caller{token: tok, task: resp.GetTask().GetId(), handle: h}
	}
	return out, nil
}

// callSeq makes provider call ids unique across the run.
var callSeq atomic.Int64

// governedCall submits one fresh retrieval and says why it failed, if it
// did: a gRPC error's ErrorInfo reason, or the request's state and outcome.
func governedCall(ctx context.Context, sys *devSystem, c caller, _ int64) (string, error) {
	id := "bench-call-" + strconv.FormatInt(callSeq.Add(1), 10)
	ctx = identity.WithBearer(ctx, c.token)
	req, err := sys.clients.Orchestrator.SubmitToolRequest(ctx, &orchestratorv1.SubmitToolRequestRequest{
		TaskId: c.task, ProviderCallId: id, Capability: scenario.Retrieve,
		Arguments: scenario.MustStruct(map[string]any{"source": c.handle, "query": "migration"}),
	})
	if err != nil {
		reason := apierror.Reason(err)
		if reason == "" {
			reason = apierror.Code(err).String()
		}
		return reason, err
	}
	if req.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		return "state " + req.GetState().String(), errors.New("not executed")
	}
	atts := req.GetAttempts()
	if len(atts) == 0 || atts[len(atts)-1].GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		return "outcome not ok", errors.New("last attempt not ok")
	}
	if len(req.GetExcerpts()) == 0 {
		return "no excerpts", errors.New("executed without excerpts")
	}
	return "", nil
}

// directSession opens the direct client's one session to the fixture.
func (r *runner) directSession(ctx context.Context, transport string) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "v0m3-bench", Version: "1"}, nil)
	var t mcp.Transport
	if transport == TransportStdio {
		t = &mcp.CommandTransport{Command: execCommand(r.cfg.Exe, "fixture-server", "--transport", "stdio")}
	} else {
		t = &mcp.StreamableClientTransport{Endpoint: r.fixtureURL, HTTPClient: pooledHTTPClient(), MaxRetries: -1}
	}
	s, err := client.Connect(ctx, t, nil)
	if err != nil {
		return nil, fmt.Errorf("direct client: connect: %w", err)
	}
	return s, nil
}

// directCall calls the search tool with the arguments the governed call's
// mapping sends.
func directCall(ctx context.Context, s *mcp.ClientSession) (string, error) {
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "search", Arguments: map[string]any{"query": "migration", "uri": scenario.MigrationFAQURI}})
	if err != nil {
		return "error", err
	}
	if res.IsError || len(res.Content) == 0 {
		return "tool error", errors.New("tool error")
	}
	return "", nil
}

// callTimeout bounds one call, so a stuck call fails instead of hanging
// the run.
const callTimeout = 2 * time.Minute

// measure runs call from n callers: a warm-up, then the measured phase,
// and fills cell. sys, when given, is the system whose CPU is charged.
func (r *runner) measure(ctx context.Context, cell *Cell, sys *devSystem, n int, call func(ctx context.Context, worker int, seq int64) (string, error)) error {
	// Warm-up: not recorded.
	if r.cfg.Calls > 0 {
		r.drive(ctx, n, 0, int64(n), call)
	} else if r.cfg.Warmup > 0 {
		r.drive(ctx, n, r.cfg.Warmup, 0, call)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var cpu0, child0, redis0 time.Duration
	var err error
	if sys != nil {
		if cpu0, child0, err = cpuTimes(sys.proc.pid()); err != nil {
			return err
		}
		if r.redis != nil && cell.Store == StoreRedis {
			if redis0, err = cpuTime(r.redis.pid()); err != nil {
				return err
			}
		}
	}
	start := time.Now()
	results := r.drive(ctx, n, r.cfg.Duration, int64(r.cfg.Calls), call)
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return err
	}
	if sys != nil {
		select {
		case <-sys.proc.done:
			return fmt.Errorf("v0m3 dev exited during the cell: %s", sys.proc.logTail())
		default:
		}
	}
	var lat []time.Duration
	for _, res := range results {
		if res.reason == "" {
			lat = append(lat, res.d)
			continue
		}
		cell.Failed++
		if cell.Failures == nil {
			cell.Failures = map[string]int{}
		}
		cell.Failures[res.reason]++
	}
	cell.Calls = len(lat)
	cell.Seconds = elapsed.Seconds()
	cell.CallsPerSec = float64(cell.Calls) / elapsed.Seconds()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	cell.P50Ms = ms(percentile(lat, 0.50))
	cell.P99Ms = ms(percentile(lat, 0.99))
	if sys != nil && len(results) > 0 {
		cpu1, child1, err := cpuTimes(sys.proc.pid())
		if err != nil {
			return err
		}
		cell.CPUMsPerCall = ms(cpu1-cpu0) / float64(len(results))
		cell.ServerCPUMsPerCall = ms(child1-child0) / float64(len(results))
		if r.redis != nil && cell.Store == StoreRedis {
			redis1, err := cpuTime(r.redis.pid())
			if err != nil {
				return err
			}
			cell.RedisCPUMsPerCall = ms(redis1-redis0) / float64(len(results))
		}
	}
	return nil
}

type result struct {
	d      time.Duration
	reason string
}

// drive runs n callers until the duration passes (limit zero) or limit
// calls were made, and returns every call's latency and failure reason.
// A call in flight at the deadline finishes and counts.
func (r *runner) drive(ctx context.Context, n int, d time.Duration, limit int64, call func(ctx context.Context, worker int, seq int64) (string, error)) []result {
	var (
		mu      sync.Mutex
		all     []result
		issued  atomic.Int64
		wg      sync.WaitGroup
		stopAt  = time.Now().Add(d)
		byLimit = limit > 0
	)
	for w := range n {
		wg.Go(func() {
			var mine []result
			for ctx.Err() == nil {
				seq := issued.Add(1)
				if byLimit && seq > limit {
					break
				}
				if !byLimit && !time.Now().Before(stopAt) {
					break
				}
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				t0 := time.Now()
				reason, err := call(cctx, w, seq)
				el := time.Since(t0)
				cancel()
				if err != nil && reason == "" {
					reason = "error"
				}
				mine = append(mine, result{d: el, reason: reason})
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return all
}

// percentile is the nearest-rank percentile of sorted latencies.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
