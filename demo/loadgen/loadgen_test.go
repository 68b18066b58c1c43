package loadgen_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/v0m3/v0m3/demo/loadgen"
	"github.com/v0m3/v0m3/internal/testkit"
)

// v0m3Bin is the real binary, built once: the bench runs it as `v0m3 dev`
// and as the fixture server.
var v0m3Bin string

func TestMain(m *testing.M) {
	bins, cleanup, err := testkit.BuildBinaries("github.com/v0m3/v0m3/cmd/v0m3")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	v0m3Bin = bins[0]
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// workDir is a directory a root adapter's stdio server uid can reach.
func workDir(t *testing.T) string {
	d := t.TempDir()
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestSmoke runs the harness for a few calls per cell on the file store
// over both transports: every governed call goes through the five services
// and succeeds, is counted, and the table has every cell. No timing is
// asserted; speed is what `make bench` measures.
func TestSmoke(t *testing.T) {
	t.Parallel()
	const calls = 6
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := loadgen.Run(ctx, loadgen.Config{
		Exe: v0m3Bin, Stores: []string{loadgen.StoreFile}, Transports: []string{loadgen.TransportHTTP, loadgen.TransportStdio},
		Callers: []int{1, 3}, Calls: calls, WorkDir: workDir(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"file/http/1/direct", "file/http/1/governed", "file/http/3/direct", "file/http/3/governed",
		"file/stdio/1/direct", "file/stdio/1/governed", "file/stdio/3/direct", "file/stdio/3/governed",
	}
	if len(rep.Cells) != len(want) {
		t.Fatalf("got %d cells, want %d: %+v", len(rep.Cells), len(want), rep.Cells)
	}
	var table bytes.Buffer
	loadgen.WriteTable(&table, rep)
	for i, c := range rep.Cells {
		if c.Key() != want[i] {
			t.Errorf("cell %d is %s, want %s", i, c.Key(), want[i])
		}
		if c.Calls != calls || c.Failed != 0 {
			t.Errorf("%s: %d calls succeeded and %d failed (%v), want %d and 0", c.Key(), c.Calls, c.Failed, c.Failures, calls)
		}
		if c.P50Ms <= 0 || c.P99Ms < c.P50Ms || c.CallsPerSec <= 0 {
			t.Errorf("%s: p50 %v, p99 %v, %v calls/s: not measured", c.Key(), c.P50Ms, c.P99Ms, c.CallsPerSec)
		}
		if c.Mode == loadgen.ModeGoverned && c.RatioToDirect <= 0 {
			t.Errorf("%s: no ratio to the direct call", c.Key())
		}
		row := fmt.Sprintf("| %s | %s | %d | %s | %d | 0 |", c.Store, c.Transport, c.Callers, c.Mode, c.Calls)
		if !strings.Contains(table.String(), row) {
			t.Errorf("the table has no row starting %q:\n%s", row, table.String())
		}
	}
}

// TestFailedCallsCounted proves a refused governed call is counted and
// shown with its reason, never dropped: with the task budget lowered to 3
// calls, the warm-up call and two measured calls pass and the rest are
// refused for budget.
func TestFailedCallsCounted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := loadgen.Run(ctx, loadgen.Config{
		Exe: v0m3Bin, Stores: []string{loadgen.StoreFile}, Transports: []string{loadgen.TransportHTTP},
		Callers: []int{1}, Calls: 6, WorkDir: workDir(t),
		DevArgs: []string{"--task-budget-calls", "3"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var g *loadgen.Cell
	for i := range rep.Cells {
		if rep.Cells[i].Mode == loadgen.ModeGoverned {
			g = &rep.Cells[i]
		}
	}
	if g == nil {
		t.Fatalf("no governed cell: %+v", rep.Cells)
	}
	if g.Calls != 2 || g.Failed != 4 {
		t.Fatalf("governed: %d succeeded, %d failed (%v); want 2 and 4", g.Calls, g.Failed, g.Failures)
	}
	if len(g.Failures) != 1 {
		t.Fatalf("failures by reason: %v, want one reason", g.Failures)
	}
	var table bytes.Buffer
	loadgen.WriteTable(&table, rep)
	for reason := range g.Failures {
		if reason == "" || !strings.Contains(table.String(), "4 × "+reason) {
			t.Errorf("the table does not show the 4 failures by reason %q:\n%s", reason, table.String())
		}
	}
	if !strings.Contains(table.String(), "| **4** |") {
		t.Errorf("the table does not flag the failed count:\n%s", table.String())
	}
}

// TestRunRefusesBadConfig: a run that cannot measure what was asked says
// so before starting anything.
func TestRunRefusesBadConfig(t *testing.T) {
	t.Parallel()
	base := loadgen.Config{Exe: v0m3Bin, Stores: []string{"file"}, Transports: []string{"http"}, Callers: []int{1}, Calls: 1}
	for name, mut := range map[string]func(*loadgen.Config){
		"no binary":         func(c *loadgen.Config) { c.Exe = "" },
		"unknown store":     func(c *loadgen.Config) { c.Stores = []string{"etcd"} },
		"unknown transport": func(c *loadgen.Config) { c.Transports = []string{"sse"} },
		"zero callers":      func(c *loadgen.Config) { c.Callers = []int{0} },
		"no length":         func(c *loadgen.Config) { c.Calls = 0 },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := base
			mut(&cfg)
			cfg.WorkDir = filepath.Join(t.TempDir(), "work")
			if _, err := loadgen.Run(context.Background(), cfg); err == nil {
				t.Fatal("accepted")
			}
			if _, err := os.Stat(cfg.WorkDir); !os.IsNotExist(err) {
				t.Errorf("the refused run made its work directory (%v)", err)
			}
		})
	}
}

// TestReadReportsMerges: a cell measured in several runs (ROUNDS of
// scripts/bench-compare.sh) sums its calls, failures and time, takes the
// median of its percentiles and the call-weighted mean of its CPU per call.
func TestReadReportsMerges(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name string, cells ...loadgen.Cell) string {
		var b bytes.Buffer
		if err := loadgen.WriteJSON(&b, &loadgen.Report{CPUs: 2, Cells: cells}); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	g := loadgen.Cell{Store: "file", Transport: "http", Callers: 1, Mode: loadgen.ModeGoverned}
	a, b, c := g, g, g
	a.Calls, a.Seconds, a.P50Ms, a.P99Ms, a.CPUMsPerCall = 100, 10, 10, 50, 4
	b.Calls, b.Failed, b.Seconds, b.P50Ms, b.P99Ms, b.CPUMsPerCall = 300, 100, 10, 30, 90, 2
	b.Failures = map[string]int{"BUDGET_EXCEEDED": 100}
	c.Calls, c.Seconds, c.P50Ms, c.P99Ms, c.CPUMsPerCall = 100, 10, 20, 60, 4
	d := loadgen.Cell{Store: "file", Transport: "http", Callers: 1, Mode: loadgen.ModeDirect, Calls: 7, Seconds: 1, P50Ms: 1}
	rep, err := loadgen.ReadReports([]string{write("1.json", d, a), write("2.json", b), write("3.json", c)})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cells) != 2 || rep.Cells[0].Mode != loadgen.ModeDirect || rep.Cells[0].Calls != 7 {
		t.Fatalf("cells: %+v, want the direct cell first, unchanged, then one governed cell", rep.Cells)
	}
	m := rep.Cells[1]
	if m.Calls != 500 || m.Failed != 100 || m.Failures["BUDGET_EXCEEDED"] != 100 || m.Seconds != 30 {
		t.Errorf("merged counts: %+v", m)
	}
	if m.P50Ms != 20 || m.P99Ms != 60 {
		t.Errorf("merged percentiles p50 %v p99 %v, want the medians 20 and 60", m.P50Ms, m.P99Ms)
	}
	// (100*4 + 400*2 + 100*4) / 600 calls made.
	if want := 1600.0 / 600; m.CPUMsPerCall != want {
		t.Errorf("merged CPU per call %v, want %v", m.CPUMsPerCall, want)
	}
	if want := 500.0 / 30; m.CallsPerSec != want {
		t.Errorf("merged calls/s %v, want %v", m.CallsPerSec, want)
	}
}

// TestSystemIsTheBinaryMeasured: the system under test is the binary
// given as System, not the bench's own (bench-compare relies on it).
func TestSystemIsTheBinaryMeasured(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "no-such-v0m3")
	_, err := loadgen.Run(context.Background(), loadgen.Config{
		Exe: v0m3Bin, System: missing, Stores: []string{loadgen.StoreFile}, Transports: []string{loadgen.TransportStdio},
		Callers: []int{1}, Calls: 1, WorkDir: workDir(t),
	})
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Run with a missing system binary: %v, want an error naming it", err)
	}
}
