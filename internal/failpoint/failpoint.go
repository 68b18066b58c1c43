// Package failpoint stops a process at a named step of its work, so that
// the fault-injection tests (test/faults) can crash or freeze a real
// service process exactly there. Points are armed only in a binary built
// with the "failpoints" build tag, through the environment variable Env;
// the production binary compiles Hit to nothing and ignores Env, so no
// configuration can make it crash itself.
package failpoint

import (
	"fmt"
	"strings"
)

// Env arms fail points in a process built with the failpoints tag:
// "point=action[,point=action...]". Each armed point acts once, the
// first time it is hit.
const Env = "V0M3_FAILPOINTS"

// MarkEnv names a file an armed point appends its name to (one line,
// synced) when it is hit, before it acts: how a test learns that the
// process reached the step it crashes or freezes at.
const MarkEnv = "V0M3_FAILPOINTS_MARK"

// Actions an armed point takes.
const (
	// Kill ends the process with SIGKILL, as a crash or `kill -9` would:
	// no deferred function, no graceful stop.
	Kill = "kill"
	// Freeze stops the whole process with SIGSTOP, as a stalled host or
	// a debugger would; it continues where it stopped on SIGCONT.
	Freeze = "freeze"
)

// Parse reads an Env value into point → action.
func Parse(spec string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		point, action, ok := strings.Cut(item, "=")
		if !ok || point == "" {
			return nil, fmt.Errorf("failpoint: %q is not point=action", item)
		}
		if action != Kill && action != Freeze {
			return nil, fmt.Errorf("failpoint: %s: unknown action %q (want %s or %s)", point, action, Kill, Freeze)
		}
		if _, dup := out[point]; dup {
			return nil, fmt.Errorf("failpoint: %s armed twice", point)
		}
		out[point] = action
	}
	return out, nil
}

// Spec is the Env value arming point with action.
func Spec(point, action string) string { return point + "=" + action }
