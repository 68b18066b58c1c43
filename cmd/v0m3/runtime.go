package main

import (
	"errors"
	"os"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// defaultGCPercent is the collector's target when GOGC is not set. A
// service's live heap is small (about 12 MB in `v0m3 dev` under 32 callers)
// while a governed call allocates quickly, so at Go's default of 100 the
// collector ran about 30 times a second under load; 400 lets the heap grow
// to five times the live heap between collections (tens of MB) and spends
// less CPU per call (docs/performance.md, the ninth step).
const defaultGCPercent = 400

// memoryLimitRatio is the part of a container's memory limit given to the Go
// runtime as its soft limit (GOMEMLIMIT): near it the collector runs more
// often, so the higher GC target cannot push a pod into its OOM kill. The
// rest is headroom for memory the runtime does not count (stacks of cgo
// threads, the page cache of a file store is not ours to count anyway).
const memoryLimitRatio = 0.9

// tuneRuntime sets the collector's defaults for a v0m3 service. Whatever the
// operator sets wins: GOGC and GOMEMLIMIT (and AUTOMEMLIMIT, a ratio in
// (0,1] or "off") are read from the environment and left alone when set.
// limit reports the container's memory limit (memlimit.FromCgroup); with no
// limit, no soft limit is set.
func tuneRuntime(limit memlimit.Provider) error {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	_, err := memlimit.Set(memlimit.WithProvider(outsideAContainer(limit)), memlimit.WithRatio(memoryLimitRatio))
	return err
}

// outsideAContainer reads a process with no cgroup (or an OS without them)
// as a process whose memory is not limited, not as a failure.
func outsideAContainer(limit memlimit.Provider) memlimit.Provider {
	return func() (uint64, error) {
		n, err := limit()
		if errors.Is(err, memlimit.ErrNoCgroup) || errors.Is(err, memlimit.ErrCgroupsNotSupported) {
			return 0, memlimit.ErrNoLimit
		}
		return n, err
	}
}
