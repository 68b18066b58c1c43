package docs_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/v0m3/v0m3/internal/testkit"
)

// dev is the one `v0m3 dev` every test of the package runs against.
var dev *devInstance

// devInstance is a running `v0m3 dev` and the scratch directory laid out
// for what the documentation runs (see the package comment).
type devInstance struct {
	repo    string            // the repository root
	scratch string            // cwd of blocks: bin -> binDir, .v0m3-data
	binDir  string            // v0m3, grpcurl, agent-go
	v0m3    string            // the binary `v0m3 dev` runs
	dataDir string            // <scratch>/.v0m3-data
	ca      string            // <dataDir>/pki/ca.crt
	addr    map[string]string // service name -> host:port
	mcpBase string            // https://host:port of the task MCP endpoints
	walkDir string            // V0M3_WALKTHROUGH_DIR, under /tmp so a sandboxed renderer reaches it
	log     *os.File          // v0m3 dev's stderr
}

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/docs:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	script, err := testkit.Script("walkthrough.sh")
	if err != nil {
		return 0, err
	}
	bins, cleanup, err := testkit.BuildBinaries("github.com/v0m3/v0m3/cmd/v0m3",
		"github.com/fullstorydev/grpcurl/cmd/grpcurl", "github.com/v0m3/v0m3/examples/agent-go")
	if err != nil {
		return 0, err
	}
	defer cleanup()
	d, stop, err := startDev(filepath.Dir(filepath.Dir(script)), bins[0])
	defer stop()
	if err != nil {
		return 0, err
	}
	dev = d
	return m.Run(), nil
}

// startDev starts `v0m3 dev` on free ports with its data directory in a
// new scratch directory, and waits until it serves.
func startDev(repo, v0m3 string) (*devInstance, func(), error) {
	var cleanups []func()
	stop := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	tempDir := func(pattern string) (string, error) {
		// Traversable by every uid: a root adapter runs local servers
		// under uids of their own, and they must reach what their
		// reviewed configuration names.
		dir, err := os.MkdirTemp("", pattern)
		if err == nil {
			cleanups = append(cleanups, func() { _ = os.RemoveAll(dir) })
			err = os.Chmod(dir, 0o755)
		}
		return dir, err
	}
	d := &devInstance{repo: repo, binDir: filepath.Dir(v0m3), v0m3: v0m3, addr: map[string]string{}}
	var err error
	if d.scratch, err = tempDir("v0m3-docs-"); err != nil {
		return nil, stop, err
	}
	if d.walkDir, err = tempDir("v0m3-docs-walkthrough-"); err != nil {
		return nil, stop, err
	}
	if err := os.Symlink(d.binDir, filepath.Join(d.scratch, "bin")); err != nil {
		return nil, stop, err
	}
	d.dataDir = filepath.Join(d.scratch, ".v0m3-data")
	d.ca = filepath.Join(d.dataDir, "pki", "ca.crt")
	if d.log, err = os.Create(filepath.Join(d.scratch, "dev.log")); err != nil {
		return nil, stop, err
	}
	cleanups = append(cleanups, func() { _ = d.log.Close() })

	cmd := exec.Command(v0m3, "dev", "--data-dir", d.dataDir, "--port-base", "0")
	cmd.Dir = d.scratch
	cmd.Env = baseEnv()
	cmd.Stderr = d.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, stop, err
	}
	if err := cmd.Start(); err != nil {
		return nil, stop, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	cleanups = append(cleanups, func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})

	ready := make(chan error, 1)
	go func() { ready <- d.readBanner(out) }()
	select {
	case err = <-ready:
	case err = <-exited:
		err = fmt.Errorf("v0m3 dev exited before serving: %v", err)
	case <-time.After(3 * time.Minute):
		err = errors.New("v0m3 dev did not print that it serves within 3 minutes")
	}
	if err != nil {
		return nil, stop, fmt.Errorf("%w\n%s", err, d.logTail())
	}
	return d, stop, nil
}

// readBanner reads what `v0m3 dev` prints until it serves: each service's
// address and the task MCP base URL. The rest of stdout is drained.
func (d *devInstance) readBanner(r io.Reader) error {
	sc := bufio.NewScanner(r)
	defer func() { go func() { _, _ = io.Copy(io.Discard, r) }() }()
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 2 && (f[0] == "orchestrator" || f[0] == "registry" || f[0] == "policy" || f[0] == "evidence" || f[0] == "adapter"):
			d.addr[f[0]] = f[1]
		case len(f) >= 3 && f[0] == "task" && f[1] == "MCP":
			d.mcpBase = strings.TrimSuffix(f[2], "/tasks/<task_id>/mcp")
		case strings.HasPrefix(sc.Text(), "serving until interrupted"):
			if len(d.addr) != 5 || d.mcpBase == "" {
				return fmt.Errorf("v0m3 dev printed addresses %v and task MCP %q: want five services and the endpoint", d.addr, d.mcpBase)
			}
			return nil
		}
	}
	return fmt.Errorf("v0m3 dev's output ended before it served: %v", sc.Err())
}

// logTail is the end of v0m3 dev's log, for a failure message.
func (d *devInstance) logTail() string {
	b, _ := os.ReadFile(d.log.Name())
	if len(b) > 8<<10 {
		b = b[len(b)-8<<10:]
	}
	return "v0m3 dev's log ends:\n" + string(b)
}

// env is what blocks and the walkthrough see (see the package comment);
// its PATH replaces the test's (the last value of a key wins).
func (d *devInstance) env() []string {
	return append(baseEnv(),
		"PATH="+d.binDir+string(os.PathListSeparator)+os.Getenv("PATH"),
		"V0M3_BIN="+d.v0m3,
		"V0M3_DATA_DIR="+d.dataDir,
		"V0M3_TLS_CA_FILE="+d.ca,
		"V0M3_ORCHESTRATOR_ADDR="+d.addr["orchestrator"],
		"V0M3_REGISTRY_ADDR="+d.addr["registry"],
		"V0M3_POLICY_ADDR="+d.addr["policy"],
		"V0M3_EVIDENCE_ADDR="+d.addr["evidence"],
		"V0M3_ADAPTER_ADDR="+d.addr["adapter"],
		"V0M3_MCP_BASE_URL="+d.mcpBase,
		"V0M3_WALKTHROUGH_DIR="+d.walkDir,
	)
}

// baseEnv is the test's environment without any V0M3_* variable: every
// flag of v0m3 reads V0M3_<FLAG>, and a developer's own settings must not
// steer what the test starts.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "V0M3_") {
			env = append(env, kv)
		}
	}
	return env
}

// requireTool returns the path of an executable the docs need that the
// project does not build: under -short (make unit) the test skips, saying
// so; missing, it fails the test under CI and skips it loudly elsewhere.
func requireTool(t *testing.T, name, why string) string {
	t.Helper()
	testkit.NeedsExternal(t, name+" ("+why+")")
	p, err := exec.LookPath(name)
	if err != nil {
		needed(t, fmt.Sprintf("%s not found on PATH (%s)", name, why))
	}
	return p
}

// needed skips the test loudly, or fails it under CI, which must run it.
func needed(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("CI must run this test: %s", why)
	}
	t.Skipf("SKIPPED, NOT RUN: %s", why)
}

// walkthrough runs scripts/walkthrough.sh once for the package and returns
// what it printed; later callers get the same output.
var walkthrough = sync.OnceValues(func() (string, error) {
	return runWalkthrough(dev.env())
})

// runWalkthrough runs the walkthrough with env; its error carries all it
// printed.
func runWalkthrough(env []string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(dev.repo, "scripts", "walkthrough.sh"))
	cmd.Dir = dev.scratch
	cmd.Env = env
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("scripts/walkthrough.sh: %w\n%s", err, out)
	}
	return string(out), nil
}
