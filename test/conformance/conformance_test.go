package conformance_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/v0m3/v0m3/internal/testkit"
	"github.com/v0m3/v0m3/test/conformance"

	"github.com/v0m3/v0m3/services/adapter"
)

// TestMain doubles as the adapter's conformance client when the runner
// starts this binary with V0M3_CONFORMANCE_CLIENT=adapter (see
// runAdapterClient).
func TestMain(m *testing.M) {
	// The in-process adapter re-executes this test binary as the sandbox
	// launcher of each local server it starts.
	if adapter.IsSandboxLaunch() {
		adapter.RunSandboxLaunch()
	}
	if os.Getenv("V0M3_CONFORMANCE_CLIENT") == "adapter" && len(os.Args) > 1 {
		os.Exit(runAdapterClient(os.Args[len(os.Args)-1], os.Getenv("MCP_CONFORMANCE_SCENARIO"), os.Getenv("MCP_CONFORMANCE_CONTEXT")))
	}
	os.Exit(m.Run())
}

const baselinePath = "testdata/baseline.json"

// Targets, as named in the baseline.
const (
	fixtureServer  = "fixture-server"          // v0m3 fixture-server over streamable HTTP
	bridgedFixture = "bridge/fixture-server"   // v0m3 bridge fronting v0m3 fixture-server over stdio
	rendererServer = "fixture-renderer"        // v0m3 fixture-renderer over streamable HTTP
	goSDKServer    = "go-sdk-server"           // the go-sdk's conformance server over streamable HTTP (stateful)
	bridgedServer  = "bridge/go-sdk-server"    // v0m3 bridge fronting the same server over stdio
	adapterClient  = "adapter-client"          // the adapter's client path (Discover, Execute)
	goSDKClient    = "go-sdk-client"           // the go-sdk's conformance client, for comparison
	taskEndpoint   = "task-endpoint"           // the orchestrator's task-scoped MCP endpoint (issue 17)
	updateBaseline = "V0M3_CONFORMANCE_UPDATE" // set to 1 to rewrite the baseline from this run
)

// The official MCP conformance suite runs against this project's servers
// (the fixture, and the bridge fronting the go-sdk's conformance server,
// which also runs directly for comparison) and clients (the adapter's
// client path, and the go-sdk's client for comparison). A scenario that
// passed in the committed baseline must still pass; one that newly passes
// is reported so the baseline can be raised. The bridge must pass every
// scenario its child passes directly.
func TestConformance(t *testing.T) {
	testkit.NeedsExternal(t, "Node 22 and the MCP conformance runner (make conformance)")
	runner, err := conformance.Installed()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI must run the MCP conformance suite: %v", err)
		}
		t.Skipf("SKIPPED, NOT RUN: %v", err)
	}
	update := os.Getenv(updateBaseline) == "1"
	base, err := conformance.ReadBaseline(baselinePath)
	switch {
	case err != nil && !update:
		t.Fatalf("read baseline: %v (take one with %s=1)", err, updateBaseline)
	case err != nil:
		base = &conformance.Baseline{}
	case base.Runner != conformance.RunnerVersion && !update:
		t.Fatalf("the baseline was taken with runner %s, the pinned runner is %s: re-take it with %s=1 and review the diff",
			base.Runner, conformance.RunnerVersion, updateBaseline)
	}
	bin := buildBinaries(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}

	targets := []struct {
		name string
		run  func(t *testing.T, dir string) (conformance.Results, error)
	}{
		{fixtureServer, func(t *testing.T, dir string) (conformance.Results, error) {
			url := startHTTP(t, bin.v0m3, "fixture-server", "--transport", "http", "--addr", "127.0.0.1:0")
			return runner.Server(t.Context(), url, dir, logFile(t, dir))
		}},
		{bridgedFixture, func(t *testing.T, dir string) (conformance.Results, error) {
			addr := testkit.FreeLoopbackAddr(t)
			start(t, addr, bin.v0m3, "bridge", "--listen", addr, "--log-level", "warn", "--", bin.v0m3, "fixture-server")
			return runner.Server(t.Context(), "http://"+addr+"/mcp", dir, logFile(t, dir))
		}},
		{rendererServer, func(t *testing.T, dir string) (conformance.Results, error) {
			url := startHTTP(t, bin.v0m3, "fixture-renderer", "--transport", "http", "--addr", "127.0.0.1:0", "--work-dir", t.TempDir())
			return runner.Server(t.Context(), url, dir, logFile(t, dir))
		}},
		{goSDKServer, func(t *testing.T, dir string) (conformance.Results, error) {
			addr := testkit.FreeLoopbackAddr(t)
			start(t, addr, bin.server, "-http="+addr, "-stateless=false")
			return runner.Server(t.Context(), "http://"+addr+"/mcp", dir, logFile(t, dir))
		}},
		{bridgedServer, func(t *testing.T, dir string) (conformance.Results, error) {
			addr := testkit.FreeLoopbackAddr(t)
			start(t, addr, bin.v0m3, "bridge", "--listen", addr, "--log-level", "warn", "--", bin.server)
			return runner.Server(t.Context(), "http://"+addr+"/mcp", dir, logFile(t, dir))
		}},
		{taskEndpoint, func(t *testing.T, dir string) (conformance.Results, error) {
			return runner.Server(t.Context(), startTaskEndpoint(t, bin.v0m3), dir, logFile(t, dir))
		}},
		{goSDKClient, func(t *testing.T, dir string) (conformance.Results, error) {
			return runner.Client(t.Context(), bin.client, nil, dir, logFile(t, dir))
		}},
		{adapterClient, func(t *testing.T, dir string) (conformance.Results, error) {
			return runner.Client(t.Context(), self, []string{"V0M3_CONFORMANCE_CLIENT=adapter"}, dir, logFile(t, dir))
		}},
	}
	results := map[string]conformance.Results{}
	for _, tc := range targets {
		t.Run(tc.name, func(t *testing.T) {
			progress("running the MCP conformance scenarios against %s (runner %s)...", tc.name, conformance.RunnerVersion)
			began := time.Now()
			res, err := tc.run(t, t.TempDir())
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			results[tc.name] = res
			progress("%s: %d of %d scenarios pass (%s)", tc.name, res.Passed(), len(res), time.Since(began).Round(time.Second))
			t.Logf("%s: %d of %d scenarios pass; failing: %s", tc.name, res.Passed(), len(res), strings.Join(failing(res), ", "))
			if update {
				base.Expect(tc.name, res)
				return
			}
			d := base.Compare(tc.name, res)
			for _, name := range d.Regressed {
				t.Errorf("REGRESSION: %s passed in the baseline and fails now (%d of %d checks failed)", name, res[name].Failed, res[name].Checks)
			}
			for _, name := range d.Missing {
				t.Errorf("scenario %s is in the baseline but did not run", name)
			}
			for _, name := range d.New {
				t.Errorf("scenario %s ran (passed: %v) but is not in the baseline: add it (%s=1)", name, res[name].Passed(), updateBaseline)
			}
			for _, name := range d.Flaky {
				t.Logf("flaky (per the baseline): %s passed: %v", name, res[name].Passed())
			}
			for _, name := range d.Improved {
				t.Logf("NEWLY PASSES: %s; raise the baseline (%s=1)", name, updateBaseline)
			}
		})
	}

	// The bridge adds nothing and loses nothing: whatever its child passes
	// directly, it passes through the bridge.
	for direct, bridged := range map[string]string{goSDKServer: bridgedServer, fixtureServer: bridgedFixture} {
		if results[direct] == nil || results[bridged] == nil {
			continue
		}
		for name, s := range results[direct] {
			if s.Passed() && !results[bridged][name].Passed() {
				t.Errorf("%s passes %s directly but not through the bridge", direct, name)
			}
		}
	}
	// The adapter's client is meant to pass whatever the go-sdk client
	// passes (issue 16); until it does, say how far it is.
	if sdk, ad := results[goSDKClient], results[adapterClient]; sdk != nil && ad != nil {
		var gap []string
		for name, s := range sdk {
			if s.Passed() && !ad[name].Passed() {
				gap = append(gap, name)
			}
		}
		slices.Sort(gap)
		t.Logf("client scenarios the go-sdk client passes and the adapter's client does not (%d): %s", len(gap), strings.Join(gap, ", "))
	}
	if update && !t.Failed() {
		base.Runner = conformance.RunnerVersion
		if err := base.Write(baselinePath); err != nil {
			t.Fatal(err)
		}
		t.Logf("baseline written to %s", baselinePath)
	}
}

func failing(res conformance.Results) []string {
	var names []string
	for name, s := range res {
		if !s.Passed() {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// progress tells whoever watches `go test` what a long step is doing.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "conformance: "+format+"\n", args...)
}

// logFile is where the runner's output goes; it is kept when a test fails.
func logFile(t *testing.T, dir string) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "runner.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Close()
		if t.Failed() {
			if out, err := os.ReadFile(f.Name()); err == nil {
				t.Logf("runner output:\n%s", out)
			}
		}
	})
	return f
}

type binaries struct{ v0m3, server, client string }

// buildBinaries builds v0m3 and the go-sdk's conformance server and client
// (from the module the project depends on).
func buildBinaries(t *testing.T) binaries {
	t.Helper()
	dir := t.TempDir()
	b := binaries{v0m3: filepath.Join(dir, "v0m3"), server: filepath.Join(dir, "everything-server"), client: filepath.Join(dir, "everything-client")}
	for out, pkg := range map[string]string{
		b.v0m3:   "github.com/v0m3/v0m3/cmd/v0m3",
		b.server: "github.com/modelcontextprotocol/go-sdk/conformance/everything-server",
		b.client: "github.com/modelcontextprotocol/go-sdk/conformance/everything-client",
	} {
		cmd := exec.CommandContext(t.Context(), "go", "build", "-o", out, pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return b
}

// start runs a server listening on addr until the test ends (SIGTERM, so
// the bridge stops its children), and waits until it accepts connections.
func start(t *testing.T, addr, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop(t, cmd)
	testkit.EventuallySucceeds(t, bin+" listens on "+addr, func() error {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	})
}

func stop(t *testing.T, cmd *exec.Cmd) {
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
}

// startHTTP runs a v0m3 fixture serving streamable HTTP and returns the
// URL it reports.
func startHTTP(t *testing.T, v0m3 string, args ...string) string {
	t.Helper()
	cmd := exec.Command(v0m3, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop(t, cmd)
	url, err := conformance.WaitForLine(stderr, "listening on ")
	if err != nil {
		t.Fatalf("%s: %v", args[0], err)
	}
	return url
}

// Results are read from the files the runner writes.
func TestReadResults(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(rel, body string) {
		p := filepath.Join(dir, rel, "checks.json")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("server-ping-2026-12-03T13-42-37-293Z", `[{"status":"SUCCESS"},{"status":"INFO"}]`)
	write("auth/metadata-var1-2026-12-03T13-43-42-406Z", `[{"status":"SUCCESS"},{"status":"FAILURE"},{"status":"WARNING"}]`)
	res, err := conformance.ReadResults(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := conformance.Results{"ping": {Checks: 2}, "auth/metadata-var1": {Checks: 3, Failed: 1}}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		t.Errorf("results = %v; want %v", res, want)
	}
	b := &conformance.Baseline{}
	b.Expect("t", conformance.Results{"ping": {Checks: 2}, "auth/metadata-var1": {Checks: 3}, "gone": {Checks: 1}, "tools": {Checks: 1, Failed: 1}, "odd": {Checks: 1}})
	b.Targets["t"]["odd"] = conformance.Flaky
	d := b.Compare("t", conformance.Results{"ping": {Checks: 2, Failed: 1}, "auth/metadata-var1": {Checks: 3}, "new": {}, "tools": {Checks: 1}, "odd": {Checks: 1, Failed: 1}})
	if got := fmt.Sprint(d.Regressed, d.Missing, d.New, d.Improved, d.Flaky); got != "[ping] [gone] [new] [tools] [odd]" {
		t.Errorf("diff = %s; want regressed [ping], missing [gone], new [new], improved [tools], flaky [odd]", got)
	}
	// Re-taking the baseline keeps a flaky mark.
	b.Expect("t", conformance.Results{"odd": {Checks: 1}})
	if b.Targets["t"]["odd"] != conformance.Flaky {
		t.Errorf("re-taken baseline: odd = %q; want it still flaky", b.Targets["t"]["odd"])
	}
}
