package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/v0m3/v0m3/demo/loadgen"
)

// runBench measures a governed call beside a direct one (see package
// loadgen) and prints the table; `v0m3 bench compare` prints two runs'
// JSON side by side.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "compare" {
		return runBenchCompare(args[1:], stdout, stderr)
	}
	fs := newFlags("bench", stderr)
	duration := fs.Duration("duration", 8*time.Second, "measured time per cell")
	calls := fs.Int("calls", 0, "calls per cell instead of --duration (shared by the cell's callers)")
	warmup := fs.Duration("warmup", time.Second, "calls made before each cell's measurement, not recorded")
	stores := fs.String("stores", "file,redis", "comma-separated stores: file, redis")
	transports := fs.String("transports", "http,stdio", "comma-separated fixture transports: http, stdio")
	callers := fs.String("callers", "1,32", "comma-separated numbers of concurrent callers")
	jsonOut := fs.String("json", "", "also write the report as JSON to this file ('-' = stdout instead of the table); 'v0m3 bench compare' reads it")
	workDir := fs.String("work-dir", "", "directory for data and child logs (default: a temporary directory, removed)")
	devArgs := fs.String("dev-args", "", "extra space-separated flags for the 'v0m3 dev' under test")
	system := fs.String("system", "", "v0m3 binary to measure as 'v0m3 dev' (default: this one; the fixture server and the load generator are always this one)")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	if err := parse(fs, args); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench: locate own binary: %w", err)
	}
	cfg := loadgen.Config{
		Exe: exe, System: *system, Stores: splitList(*stores), Transports: splitList(*transports),
		Duration: *duration, Calls: *calls, Warmup: *warmup, WorkDir: *workDir,
		DevArgs: strings.Fields(*devArgs), Progress: stderr,
	}
	if *quiet {
		cfg.Progress = nil
	}
	for _, c := range splitList(*callers) {
		n, err := strconv.Atoi(c)
		if err != nil {
			return usageError{fmt.Sprintf("--callers: %q is not a number", c)}
		}
		cfg.Callers = append(cfg.Callers, n)
	}
	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if *jsonOut == "-" {
		return loadgen.WriteJSON(stdout, rep)
	}
	if *jsonOut != "" {
		f, err := os.Create(*jsonOut)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if err := loadgen.WriteJSON(f, rep); err != nil {
			_ = f.Close()
			return fmt.Errorf("bench: %w", err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	fmt.Fprintf(stdout, "v0m3 bench: %d CPUs (%s/%s), %s\n\n", rep.CPUs, runtime.GOOS, runtime.GOARCH, cellLength(rep))
	loadgen.WriteTable(stdout, rep)
	return nil
}

func cellLength(rep *loadgen.Report) string {
	if rep.CallsEach > 0 {
		return fmt.Sprintf("%d calls per cell", rep.CallsEach)
	}
	return rep.Duration + " per cell"
}

// runBenchCompare prints `v0m3 bench --json` reports side by side:
// before and after are comma-separated lists of files, merged per side.
func runBenchCompare(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench compare", stderr)
	before := fs.String("before", "", "comma-separated JSON reports of the base (required)")
	after := fs.String("after", "", "comma-separated JSON reports of the change (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *before == "" || *after == "" {
		return usageError{"--before and --after are required"}
	}
	b, err := loadgen.ReadReports(splitList(*before))
	if err != nil {
		return err
	}
	a, err := loadgen.ReadReports(splitList(*after))
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "before:")
	fmt.Fprintln(stdout)
	loadgen.WriteTable(stdout, b)
	fmt.Fprintln(stdout)
	fmt.Fprintln(stdout, "after:")
	fmt.Fprintln(stdout)
	loadgen.WriteTable(stdout, a)
	fmt.Fprintln(stdout)
	fmt.Fprintln(stdout, "after/before:")
	fmt.Fprintln(stdout)
	loadgen.WriteComparison(stdout, b, a)
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
