package adapter

import (
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A connection's dedicated uid is claimed on its first run and kept for
// it: a file per uid in the lock directory names the connection that owns
// it. Claims are made under one lock, so adapters sharing the directory
// never give one uid to two connections. While a server runs it holds a
// shared lock on its uid's file; the run that ends last (it alone can then
// take the lock exclusively) kills whatever the connection left running,
// and the first run after an idle period does the same for leftovers of
// an adapter that died. A claim unused for claimTTL may go to another
// connection, after everything of its old owner still running is killed.

// claimTTL is how long a connection's uid stays reserved for it after its
// last run.
const claimTTL = 30 * 24 * time.Hour

// leaseWait bounds how long a run waits for a run that is ending to
// finish killing what it left: as long as that may take (reapWait).
const leaseWait = reapWait + 5*time.Second

// claimsLock is the file whose lock serialises claims.
const claimsLock = "claims.lock"

// uidLease is a connection's uid held by one running server.
type uidLease struct {
	uid  uint32
	lock *os.File // shared flock on the uid's claim file
}

// errNoFreeUID says every uid of the range is claimed.
var errNoFreeUID = setupFailed("every uid of the sandbox range is claimed by a connection")

// leaseUID returns connID's uid, claiming one of r on its first run, held
// for one run. When no other run holds it, processes left under it are
// killed first.
func leaseUID(r UIDRange, lockDir, connID string) (*uidLease, error) {
	if err := prepareLockDir(lockDir); err != nil {
		return nil, err
	}
	uid, f, err := claimUID(r, lockDir, connID)
	if err != nil {
		return nil, err
	}
	fd := int(f.Fd())
	if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil && !reapUID(uid) {
		_ = f.Close()
		return nil, setupFailed("processes an earlier run left under uid %d could not be ended", uid)
	}
	// Shared while running: a conversion from the exclusive lock, or
	// joining runs in progress, once a run that is ending has finished.
	deadline := time.Now().Add(leaseWait)
	for unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB) != nil {
		if time.Now().After(deadline) {
			_ = f.Close()
			return nil, setupFailed("uid %d is still held by an ending run whose processes could not be ended", uid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	now := time.Now()
	_ = os.Chtimes(f.Name(), now, now) // last use, for claimTTL
	return &uidLease{uid: uid, lock: f}, nil
}

// release ends the run's hold on its uid. The last run kills whatever the
// connection left running under it; if that fails, the uid stays locked,
// so no run starts beside processes it cannot account for.
func (l *uidLease) release() (ok bool) {
	fd := int(l.lock.Fd())
	_ = unix.Flock(fd, unix.LOCK_UN)
	if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil && !reapUID(l.uid) {
		return false // keep the exclusive lock
	}
	_ = l.lock.Close()
	return true
}

// claimUID returns connID's uid and its open claim file, claiming a free
// or expired uid of r (starting at a hash of connID) if it has none.
func claimUID(r UIDRange, lockDir, connID string) (uint32, *os.File, error) {
	g, err := os.OpenFile(filepath.Join(lockDir, claimsLock), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return 0, nil, setupFailed("uid claims: %w", err)
	}
	defer g.Close()
	if err := unix.Flock(int(g.Fd()), unix.LOCK_EX); err != nil {
		return 0, nil, setupFailed("uid claims: %w", err)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(connID))
	start := h.Sum32()
	for i := range r.Count {
		uid := r.First + (start+i)%r.Count
		f, err := os.OpenFile(filepath.Join(lockDir, strconv.FormatUint(uint64(uid), 10)), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return 0, nil, setupFailed("uid claim: %w", err)
		}
		b, err := io.ReadAll(io.LimitReader(f, 1024))
		if err != nil {
			_ = f.Close()
			return 0, nil, setupFailed("uid claim: %w", err)
		}
		owner := strings.TrimSpace(string(b))
		if owner == connID {
			return uid, f, nil
		}
		if owner == "" || expired(f) {
			if err := f.Truncate(0); err != nil {
				_ = f.Close()
				return 0, nil, setupFailed("uid claim: %w", err)
			}
			if _, err := f.WriteAt([]byte(connID+"\n"), 0); err != nil {
				_ = f.Close()
				return 0, nil, setupFailed("uid claim: %w", err)
			}
			if err := f.Sync(); err != nil {
				_ = f.Close()
				return 0, nil, setupFailed("uid claim: %w", err)
			}
			return uid, f, nil
		}
		_ = f.Close()
	}
	return 0, nil, errNoFreeUID
}

// expired reports whether a claim was last used more than claimTTL ago
// and no run holds it now.
func expired(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil || time.Since(fi.ModTime()) < claimTTL {
		return false
	}
	fd := int(f.Fd())
	if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false
	}
	_ = unix.Flock(fd, unix.LOCK_UN)
	return true
}

// prepareLockDir makes the lock directory exist, belong to root and be
// closed to everyone else.
func prepareLockDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return setupFailed("uid lock directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return setupFailed("uid lock directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || st.Uid != 0 {
		return setupFailed("uid lock directory %s is not a directory owned by root", dir)
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return setupFailed("uid lock directory: %w", err)
		}
	}
	return nil
}

// reapWait bounds how long reapUID keeps killing. It is a time, not a
// number of rounds: on a loaded machine a killed process may take seconds
// to be gone, and giving up early leaves the uid locked.
const reapWait = 30 * time.Second

// reapUID kills every process running under uid until none is left, and
// reports whether that happened. Each round kills all it sees; a process
// forked meanwhile is seen by the next round, and the process limit bounds
// how many there can be.
func reapUID(uid uint32) bool {
	if uid == 0 {
		return false // never root's processes
	}
	deadline := time.Now().Add(reapWait)
	for round := 0; ; round++ {
		pids := pidsOf(uid)
		if len(pids) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(time.Duration(min(round+1, 20)) * time.Millisecond)
	}
}

// pidsOf returns the live (not zombie) processes any of whose uids (real,
// effective, saved, filesystem) is uid.
func pidsOf(uid uint32) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := strconv.FormatUint(uint64(uid), 10)
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue // gone
		}
		var state string
		match := false
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "State:"); ok {
				state = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				for _, f := range strings.Fields(v) {
					match = match || f == want
				}
			}
		}
		if match && !strings.HasPrefix(state, "Z") && !strings.HasPrefix(state, "X") {
			pids = append(pids, pid)
		}
	}
	return pids
}
