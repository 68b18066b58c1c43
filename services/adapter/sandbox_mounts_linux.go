package adapter

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// privateDirs are the directories every process on a host may write and
// so could use to reach another: each server gets a fresh, empty tmpfs of
// its own on each (in its own mount namespace; an IPC namespace of its own
// covers System V shared memory).
var privateDirs = []string{"/tmp", "/var/tmp", "/dev/shm"}

// Bounds of each private directory: memory is what a tmpfs spends.
const (
	privateDirBytes  = 64 << 20
	privateDirInodes = 16 << 10
)

// runDirs creates a run's own home, temporary, runtime and XDG base
// directories inside its working directory dir, owned by owner (-1: the
// adapter's uid, which the server shares), and returns HOME and env with
// them set. They replace any configured value: a server's files are its
// run's, never a directory another process shares. (A uid with no passwd
// entry has no home otherwise, and Node, among others, dies at start
// without one.)
func runDirs(dir string, owner int, env []string) (string, []string, error) {
	home := filepath.Join(dir, "home")
	vars := []struct{ name, path string }{
		{"HOME", home},
		{"TMPDIR", filepath.Join(dir, "tmp")},
		{"XDG_RUNTIME_DIR", filepath.Join(dir, "run")},
		{"XDG_CONFIG_HOME", filepath.Join(home, ".config")},
		{"XDG_CACHE_HOME", filepath.Join(home, ".cache")},
		{"XDG_DATA_HOME", filepath.Join(home, ".local", "share")},
		{"XDG_STATE_HOME", filepath.Join(home, ".local", "state")},
	}
	for _, v := range vars {
		if err := os.MkdirAll(v.path, 0o700); err != nil {
			return "", nil, setupFailed("create the server's %s: %w", v.name, err)
		}
		env = withEnv(env, v.name, v.path)
	}
	if owner >= 0 {
		err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, owner, owner)
		})
		if err != nil {
			return "", nil, setupFailed("give the server's home to its uid: %w", err)
		}
	}
	return home, env, nil
}

// configuredPaths returns the host paths under the private directories
// that a server's configuration names (its executable, absolute paths in
// its arguments, as "--opt=/path" too, and in its environment): each is
// bound back into its mount namespace as the entry right under the
// private directory that holds it (a script needs its package beside it,
// a file to create its directory), if that exists; never a private
// directory itself, nor anything in the adapter's data directory. The
// reviewed configuration decides what the server reaches there, nothing
// else.
func configuredPaths(private []string, dataDir, exe string, args, env []string) []string {
	candidates := []string{exe}
	for _, a := range args {
		if _, v, ok := strings.Cut(a, "="); ok && filepath.IsAbs(v) {
			candidates = append(candidates, v)
		}
		candidates = append(candidates, a)
	}
	for _, kv := range env {
		if _, v, ok := strings.Cut(kv, "="); ok {
			candidates = append(candidates, v)
		}
	}
	under := func(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	var out []string
	for _, c := range candidates {
		if !filepath.IsAbs(c) {
			continue
		}
		p := filepath.Clean(c)
		i := slices.IndexFunc(private, func(d string) bool { return strings.HasPrefix(p, d+"/") })
		if i < 0 || under(p, dataDir) {
			continue
		}
		top, _, _ := strings.Cut(strings.TrimPrefix(p, private[i]+"/"), "/")
		p = filepath.Join(private[i], top)
		if _, err := os.Lstat(p); err == nil && !under(p, dataDir) {
			out = append(out, p)
		}
	}
	// A path inside another one is reached through it.
	slices.Sort(out)
	out = slices.Compact(out)
	return slices.DeleteFunc(out, func(p string) bool {
		return slices.ContainsFunc(out, func(q string) bool { return q != p && strings.HasPrefix(p, q+"/") })
	})
}

// apply makes the mounts, in the launcher's own mount namespace, before it
// takes the server's identity. proc mounts a fresh /proc, showing the
// launcher's PID namespace only.
func (m *launcherMounts) apply(proc bool) error {
	// Nothing mounted here propagates to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	// Handles on what stays reachable, taken before the private
	// directories cover it. (They close on exec.)
	run, err := unix.Open(m.RunDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	binds := make([]int, len(m.Binds))
	for i, p := range m.Binds {
		if binds[i], err = unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0); err != nil {
			return err
		}
	}
	if proc {
		if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("mode=0700,uid=%d,gid=%d,size=%d,nr_inodes=%d", m.Owner, m.Owner, privateDirBytes, privateDirInodes)
	for _, d := range m.Private {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			continue // nothing there to share
		}
		if err := unix.Mount("tmpfs", d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return err
		}
	}
	for i, p := range m.Binds {
		if err := bindAt(binds[i], p, 0o755); err != nil {
			return err
		}
	}
	// The data directory: empty, closed (only traversable), holding the
	// path to this run's directory alone.
	if err := os.MkdirAll(m.DataDir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", m.DataDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0711,size=65536,nr_inodes=64"); err != nil {
		return err
	}
	rel, err := filepath.Rel(m.DataDir, m.RunDir)
	if err != nil || strings.HasPrefix(rel, "..") {
		return unix.EINVAL
	}
	if err := os.MkdirAll(filepath.Dir(m.RunDir), 0o711); err != nil {
		return err
	}
	return bindAt(run, m.RunDir, 0o700)
}

// bindAt binds what fd refers to at path p, creating the mount point (and
// its parents, mode 0755) as a directory or file like it.
func bindAt(fd int, p string, mode uint32) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := unix.Mkdir(p, mode); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
	} else {
		f, err := unix.Open(p, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return err
		}
		_ = unix.Close(f)
	}
	return unix.Mount("/proc/self/fd/"+strconv.Itoa(fd), p, "", unix.MS_BIND|unix.MS_REC, "")
}
