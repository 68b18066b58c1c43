// Package escape is a hostile local MCP server for the adapter's sandbox
// tests: asked through a tool call, it tries to break out of its sandbox
// (read other processes' environment and memory, signal them, read or
// write the adapter's data directory, fork without bound, leave a process
// running in a session of its own, read other processes' command lines,
// leave files in the host's shared directories, create namespaces, make
// system calls a tool server has no use for) and reports what it managed. It reports whether what it read contains the needles
// it was given, never what it read, so no secret crosses back.
package escape

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tool names.
const (
	// ToolEscape tries every escape named in its EscapeIn.
	ToolEscape = "escape"
	// ToolHold answers only once the process receives SIGUSR1 (or after
	// HoldMax), keeping the server running meanwhile; it reports the
	// server's identity.
	ToolHold = "hold"
)

// HoldMax bounds how long the hold tool holds.
const HoldMax = 60 * time.Second

// maxForks bounds the forks one call may ask for.
const maxForks = 1024

// EscapeIn says which escapes to try.
type EscapeIn struct {
	// PIDs are processes whose environment and memory to read and which to
	// signal (signal 0: permission check only).
	PIDs []int `json:"pids,omitempty"`
	// Needles are strings to look for in what was read (e.g. the name of
	// a credential variable).
	Needles []string `json:"needles,omitempty"`
	// DataDir is the adapter's data directory: to list, read Planted in,
	// and write a file into.
	DataDir string `json:"data_dir,omitempty"`
	// Planted is the name of a file in DataDir to read.
	Planted string `json:"planted,omitempty"`
	// Forks is how many processes to try to start at once.
	Forks int `json:"forks,omitempty"`
	// Daemon starts a process in a session of its own (out of the server's
	// process group) and leaves it running, to outlive the server.
	Daemon bool `json:"daemon,omitempty"`
	// Cmdlines reads the command line of every process it can see and
	// looks for Needles in them (bearer tokens travel there).
	Cmdlines bool `json:"cmdlines,omitempty"`
	// Shared are directories every process may write (/tmp, /dev/shm):
	// it writes a file named Marker into each, for another to find.
	Shared []string `json:"shared,omitempty"`
	// Marker names the files written into Shared.
	Marker string `json:"marker,omitempty"`
	// Namespaces tries to create user (and other) namespaces and to enter
	// one.
	Namespaces bool `json:"namespaces,omitempty"`
	// Syscalls tries system calls a tool server has no use for.
	Syscalls bool `json:"syscalls,omitempty"`
}

// Attempt is one escape tried.
type Attempt struct {
	// Name says what was tried, e.g. "environ 123".
	Name string `json:"name"`
	// OK says whether it worked.
	OK bool `json:"ok"`
	// Error is the error when it did not, e.g. "permission denied".
	Error string `json:"error,omitempty"`
	// Found are the needles in what was read.
	Found []string `json:"found,omitempty"`
}

// Identity is who the server ran as and under what.
type Identity struct {
	UID        int      `json:"uid"`
	GID        int      `json:"gid"`
	Groups     []int    `json:"groups"`
	PID        int      `json:"pid"`
	NoNewPrivs bool     `json:"no_new_privs"`
	Limits     []string `json:"limits"` // lines of /proc/self/limits
	// OwnDirWritable says whether the server could write into its working
	// directory (a control: the sandbox leaves it somewhere to work).
	OwnDirWritable bool `json:"own_dir_writable"`
	// Seccomp is the Seccomp field of /proc/self/status (2: a filter).
	Seccomp int `json:"seccomp"`
	// Env holds HOME, TMPDIR, XDG_RUNTIME_DIR and the XDG base directory
	// variables as the server got them.
	Env map[string]string `json:"env"`
	// Writable are those of Env whose directory the server could write.
	Writable []string `json:"writable"`
	// VisibleProcesses is how many processes /proc shows.
	VisibleProcesses int `json:"visible_processes"`
}

// DirVars are the variables naming a server's own directories.
var DirVars = []string{"HOME", "TMPDIR", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"}

// Report is the escape tool's answer.
type Report struct {
	Identity Identity  `json:"identity"`
	Attempts []Attempt `json:"attempts"`
	// ForksStarted is how many of the requested processes started.
	ForksStarted int `json:"forks_started"`
	// ForkError is the error that stopped the forks, if one did.
	ForkError string `json:"fork_error,omitempty"`
	// DaemonPID is the process left running, if one was.
	DaemonPID int `json:"daemon_pid,omitempty"`
}

// Attempt returns the attempt named name.
func (r *Report) Attempt(name string) (Attempt, bool) {
	i := slices.IndexFunc(r.Attempts, func(a Attempt) bool { return a.Name == name })
	if i < 0 {
		return Attempt{}, false
	}
	return r.Attempts[i], true
}

// NewServer returns the hostile server.
func NewServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "escape", Version: "1"}, nil)
	release := make(chan os.Signal, 1)
	signal.Notify(release, syscall.SIGUSR1)
	mcp.AddTool(s, &mcp.Tool{Name: ToolEscape, Description: "Tries to escape the sandbox."},
		func(_ context.Context, _ *mcp.CallToolRequest, in EscapeIn) (*mcp.CallToolResult, any, error) {
			return jsonResult(Try(in))
		})
	mcp.AddTool(s, &mcp.Tool{Name: ToolHold, Description: "Holds until released, then reports who it ran as."},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			case <-time.After(HoldMax):
			}
			return jsonResult(Report{Identity: identity()})
		})
	return s
}

func jsonResult(v any) (*mcp.CallToolResult, any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, nil, err
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}}, nil, nil
}

// Try tries every escape in 'in' and reports.
func Try(in EscapeIn) Report {
	r := Report{Identity: identity()}
	add := func(name string, found []string, err error) {
		a := Attempt{Name: name, OK: err == nil, Found: found}
		if err != nil {
			a.Error = errText(err)
		}
		r.Attempts = append(r.Attempts, a)
	}
	for _, pid := range in.PIDs {
		p := strconv.Itoa(pid)
		b, err := os.ReadFile("/proc/" + p + "/environ")
		add("environ "+p, found(b, in.Needles), err)
		f, err := os.Open("/proc/" + p + "/mem")
		if err == nil {
			_ = f.Close()
		}
		add("mem "+p, nil, err)
		add("signal "+p, nil, syscall.Kill(pid, 0))
	}
	if in.DataDir != "" {
		_, err := os.ReadDir(in.DataDir)
		add("list data dir", nil, err)
		if in.Planted != "" {
			b, err := os.ReadFile(filepath.Join(in.DataDir, in.Planted))
			add("read planted", found(b, in.Needles), err)
		}
		err = os.WriteFile(filepath.Join(in.DataDir, "escape-"+strconv.Itoa(os.Getpid())), []byte("escaped"), 0o644)
		add("write data dir", nil, err)
		// The connection's directory, above the working directory.
		_, err = os.ReadDir("..")
		add("list parent dir", nil, err)
	}
	if in.Forks > 0 {
		r.ForksStarted, r.ForkError = forkMany(min(in.Forks, maxForks))
	}
	if in.Cmdlines {
		var hits []string
		read := 0
		for _, pid := range pids() {
			if pid == os.Getpid() {
				continue
			}
			if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); err == nil {
				read++
				hits = append(hits, found(b, in.Needles)...)
			}
		}
		var err error
		if read == 0 {
			err = errors.New("no other process visible")
		}
		slices.Sort(hits)
		add("cmdlines", slices.Compact(hits), err)
	}
	for _, dir := range in.Shared {
		add("write "+dir, nil, os.WriteFile(filepath.Join(dir, in.Marker), []byte("escaped"), 0o644))
	}
	if in.Namespaces {
		tryNamespaces(add)
	}
	if in.Syscalls {
		trySyscalls(add)
	}
	if in.Daemon {
		c := exec.Command("/bin/sleep", "300")
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		err := c.Start()
		if err == nil {
			r.DaemonPID = c.Process.Pid
			_ = c.Process.Release()
		}
		add("daemon", nil, err)
	}
	return r
}

// forkMany starts up to n sleeping processes, all at once, then ends them.
func forkMany(n int) (int, string) {
	var cmds []*exec.Cmd
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	for range n {
		c := exec.Command("/bin/sleep", "60")
		if err := c.Start(); err != nil {
			return len(cmds), errText(err)
		}
		cmds = append(cmds, c)
	}
	return len(cmds), ""
}

func identity() Identity {
	id := Identity{UID: os.Getuid(), GID: os.Getgid(), PID: os.Getpid()}
	id.Groups, _ = os.Getgroups()
	if id.Groups == nil {
		id.Groups = []int{}
	}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "NoNewPrivs:"); ok {
				id.NoNewPrivs = strings.TrimSpace(v) == "1"
			}
		}
	}
	if b, err := os.ReadFile("/proc/self/limits"); err == nil {
		id.Limits = strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	if err := os.WriteFile("probe", []byte("mine"), 0o600); err == nil {
		id.OwnDirWritable = true
		_ = os.Remove("probe")
	}
	id.Env = map[string]string{}
	for _, v := range DirVars {
		dir, ok := os.LookupEnv(v)
		if !ok {
			continue
		}
		id.Env[v] = dir
		probe := filepath.Join(dir, "probe")
		if err := os.MkdirAll(dir, 0o700); err == nil && os.WriteFile(probe, []byte("mine"), 0o600) == nil {
			id.Writable = append(id.Writable, v)
			_ = os.Remove(probe)
		}
	}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "Seccomp:"); ok {
				id.Seccomp, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
	}
	id.VisibleProcesses = len(pids())
	return id
}

// pids are the processes /proc shows.
func pids() []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

func found(b []byte, needles []string) []string {
	var out []string
	for _, n := range needles {
		if n != "" && strings.Contains(string(b), n) {
			out = append(out, n)
		}
	}
	return out
}

// errText is an error's errno text when it has one ("permission denied").
func errText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}
