//go:build failpoints

package failpoint

import (
	"fmt"
	"os"
	"sync"
	"syscall"
)

// Enabled reports whether this binary honours Env: true, it was built
// with the failpoints tag (tests only).
const Enabled = true

var (
	mu sync.Mutex
	// armed is read from Env once; a malformed value ends the process at
	// start rather than running a test with a point silently unarmed.
	armed = func() map[string]string {
		a, err := Parse(os.Getenv(Env))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		return a
	}()
)

// Hit acts on point when it is armed (once): it records the hit in the
// MarkEnv file, then kills or freezes this process.
func Hit(point string) {
	mu.Lock()
	action, ok := armed[point]
	delete(armed, point)
	mu.Unlock()
	if !ok {
		return
	}
	mark(point)
	switch action {
	case Kill:
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is delivered asynchronously; never go on
	case Freeze:
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	}
}

func mark(point string) {
	name := os.Getenv(MarkEnv)
	if name == "" {
		return
	}
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, "failpoint: mark:", err)
		return
	}
	_, _ = fmt.Fprintln(f, point)
	_ = f.Sync()
	_ = f.Close()
}
