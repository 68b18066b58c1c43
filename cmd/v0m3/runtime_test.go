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
)

// runtimeChildEnv names the container limit a re-executed test binary
// reports to tuneRuntime; only that child reads it.
const runtimeChildEnv = "V0M3_TEST_RUNTIME_CHILD"

// childLimits are the container limits a child can be given.
var childLimits = map[string]memlimit.Provider{
	"none":   func() (uint64, error) { return 0, memlimit.ErrNoCgroup },
	"1GiB":   memlimit.Limit(1 << 30),
	"broken": func() (uint64, error) { return 0, errors.New("cgroup files unreadable") },
}

// The collector's defaults apply only where the operator set nothing:
// GOGC, GOMEMLIMIT and AUTOMEMLIMIT in the environment win, and a container's
// memory limit becomes a soft limit below it. Each case runs in a fresh
// process, since these settings belong to the whole process.
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
			cmd := exec.Command(os.Args[0], "-test.run=^TestRuntimeDefaultsChild$")
			for _, kv := range os.Environ() {
				if k, _, _ := strings.Cut(kv, "="); k != "GOGC" && k != "GOMEMLIMIT" && k != "AUTOMEMLIMIT" {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(append(cmd.Env, runtimeChildEnv+"="+tc.limit), tc.env...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			var gc, limit int64
			var errText string
			if _, err := fmt.Sscanf(childReport(string(out)), "runtime: gc=%d limit=%d err=%q", &gc, &limit, &errText); err != nil {
				t.Fatalf("child output %q: %v", out, err)
			}
			if gc != tc.wantGC || limit != tc.wantLimit {
				t.Errorf("GC percent %d, memory limit %d; want %d, %d", gc, limit, tc.wantGC, tc.wantLimit)
			}
			if (errText != "") != tc.wantErr {
				t.Errorf("tuneRuntime error %q, want an error: %v", errText, tc.wantErr)
			}
		})
	}
}

// TestRuntimeDefaultsChild is TestRuntimeDefaults' child process; run
// alone it does nothing.
func TestRuntimeDefaultsChild(t *testing.T) {
	name, ok := os.LookupEnv(runtimeChildEnv)
	if !ok {
		t.Skip("run by TestRuntimeDefaults")
	}
	err := tuneRuntime(childLimits[name])
	errText := ""
	if err != nil {
		errText = err.Error()
	}
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(s)
	fmt.Printf("\nruntime: gc=%d limit=%d err=%q\n", int64(s[0].Value.Uint64()), int64(s[1].Value.Uint64()), errText)
}

// childReport is the line the child printed what it read on.
func childReport(out string) string {
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "runtime: ") {
			return line
		}
	}
	return ""
}
