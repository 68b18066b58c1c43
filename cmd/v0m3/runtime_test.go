package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime/metrics"
	"strings"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/v0m3/v0m3/services/adapter"
)

// childEnv makes the test binary a child process that reports the
// collector's settings (see TestMain): "tune <limit>" runs tuneRuntime with
// one of childLimits, "main <args>" runs main with args.
const childEnv = "V0M3_TEST_RUNTIME_CHILD"

// childLimits are the container limits a child can be given.
var childLimits = map[string]memlimit.Provider{
	"none":   func() (uint64, error) { return 0, memlimit.ErrNoCgroup },
	"1GiB":   memlimit.Limit(1 << 30),
	"broken": func() (uint64, error) { return 0, errors.New("cgroup files unreadable") },
}

func TestMain(m *testing.M) {
	// The in-process adapter re-executes this test binary as the sandbox
	// launcher of each local server it starts.
	if adapter.IsSandboxLaunch() {
		adapter.RunSandboxLaunch()
	}
	child, ok := os.LookupEnv(childEnv)
	if !ok {
		os.Exit(m.Run())
	}
	// These settings belong to the whole process: each case runs in one
	// of its own.
	var err error
	switch mode, arg, _ := strings.Cut(child, " "); mode {
	case "tune":
		err = tuneRuntime(childLimits[arg])
	case "main":
		os.Args = append([]string{"v0m3"}, strings.Fields(arg)...)
		main()
	}
	errText := ""
	if err != nil {
		errText = err.Error()
	}
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(s)
	fmt.Printf("\nruntime: gc=%d limit=%d err=%q\n", int64(s[0].Value.Uint64()), int64(s[1].Value.Uint64()), errText)
	os.Exit(0)
}

// runChild runs the test binary as a child (see TestMain) with env added
// to an environment without GOGC, GOMEMLIMIT and AUTOMEMLIMIT, and returns
// the collector's target and soft limit it reported, and tuneRuntime's
// error.
func runChild(t *testing.T, child string, env ...string) (gc, limit int64, errText string) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "GOGC" && k != "GOMEMLIMIT" && k != "AUTOMEMLIMIT" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, childEnv+"="+child), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %q: %v\n%s", child, err, out)
	}
	for line := range strings.Lines(string(out)) {
		if strings.HasPrefix(line, "runtime: ") {
			if _, err := fmt.Sscanf(line, "runtime: gc=%d limit=%d err=%q", &gc, &limit, &errText); err != nil {
				t.Fatalf("child %q reported %q: %v", child, line, err)
			}
			return gc, limit, errText
		}
	}
	t.Fatalf("child %q reported nothing:\n%s", child, out)
	return 0, 0, ""
}

// The collector's defaults apply only where the operator set nothing:
// GOGC, GOMEMLIMIT and AUTOMEMLIMIT in the environment win, and a container's
// memory limit becomes a soft limit below it.
func TestRuntimeDefaults(t *testing.T) {
	t.Parallel()
	const gib = 1 << 30
	for _, tc := range []struct {
		name      string
		env       []string
		limit     string
		wantGC    int64
		wantLimit int64
		wantErr   bool
	}{
		{name: "no container limit", limit: "none", wantGC: defaultGCPercent, wantLimit: math.MaxInt64},
		{name: "container limit", limit: "1GiB", wantGC: defaultGCPercent, wantLimit: gib * 9 / 10},
		{name: "GOGC set", env: []string{"GOGC=150"}, limit: "1GiB", wantGC: 150, wantLimit: gib * 9 / 10},
		{name: "GOGC off", env: []string{"GOGC=off"}, limit: "none", wantGC: -1, wantLimit: math.MaxInt64},
		{name: "GOMEMLIMIT set", env: []string{"GOMEMLIMIT=256MiB"}, limit: "1GiB", wantGC: defaultGCPercent, wantLimit: 256 << 20},
		{name: "AUTOMEMLIMIT ratio", env: []string{"AUTOMEMLIMIT=0.5"}, limit: "1GiB", wantGC: defaultGCPercent, wantLimit: gib / 2},
		{name: "AUTOMEMLIMIT off", env: []string{"AUTOMEMLIMIT=off"}, limit: "1GiB", wantGC: defaultGCPercent, wantLimit: math.MaxInt64},
		{name: "unreadable limit", limit: "broken", wantGC: defaultGCPercent, wantLimit: math.MaxInt64, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			gc, limit, errText := runChild(t, "tune "+tc.limit, tc.env...)
			if gc != tc.wantGC || limit != tc.wantLimit {
				t.Errorf("GC percent %d, memory limit %d; want %d, %d", gc, limit, tc.wantGC, tc.wantLimit)
			}
			if (errText != "") != tc.wantErr {
				t.Errorf("tuneRuntime error %q, want an error: %v", errText, tc.wantErr)
			}
		})
	}
}

// Only the commands that serve governed calls take the higher target; the
// operator and the CLI verbs run as Go would run them.
func TestOnlyServicesTuneTheRuntime(t *testing.T) {
	t.Parallel()
	for args, want := range map[string]int64{
		"dev -h":          defaultGCPercent,
		"orchestrator -h": defaultGCPercent,
		"adapter -h":      defaultGCPercent,
		"operator -h":     100,
		"token -h":        100,
	} {
		t.Run(args, func(t *testing.T) {
			t.Parallel()
			if gc, _, _ := runChild(t, "main "+args); gc != want {
				t.Errorf("v0m3 %s runs at GC percent %d, want %d", args, gc, want)
			}
		})
	}
}
