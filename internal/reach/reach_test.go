package reach

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckAddr(t *testing.T) {
	t.Parallel()
	dev := Policy{AllowLoopback: true, AllowPrivate: true}
	strict := Policy{}
	tests := []struct {
		addr               string
		devOK, strictOK    bool
		wantDetailContains string
	}{
		{"169.254.169.254", false, false, "metadata"},
		{"169.254.170.2", false, false, "metadata"},
		{"169.254.1.1", false, false, "link-local"},
		{"fe80::1", false, false, "link-local"},
		{"fe80::1%eth0", false, false, "link-local"},
		{"fd00:ec2::254", false, false, "metadata"},
		{"100.100.100.200", false, false, "metadata"},
		{"168.63.129.16", false, false, "Azure"},
		{"::ffff:169.254.169.254", false, false, "metadata"},
		{"64:ff9b::a9fe:a9fe", false, false, "metadata"}, // NAT64 of 169.254.169.254
		{"2002:a9fe:a9fe::1", false, false, "metadata"},  // 6to4 of 169.254.169.254
		{"0.0.0.0", false, false, "not a host address"},
		{"0.1.2.3", false, false, "not a host address"},
		{"::", false, false, "not a host address"},
		{"239.1.2.3", false, false, "multicast"},
		{"255.255.255.255", false, false, "broadcast"},
		{"ff02::1", false, false, "link-local"},
		{"127.0.0.1", true, false, "loopback"},
		{"127.8.9.10", true, false, "loopback"},
		{"::1", true, false, "loopback"},
		{"::ffff:127.0.0.1", true, false, "loopback"},
		{"10.1.2.3", true, false, "private"},
		{"172.16.0.1", true, false, "private"},
		{"192.168.1.1", true, false, "private"},
		{"100.64.0.1", true, false, "private"},
		{"fd12:3456::1", true, false, "private"},
		{"93.184.216.34", true, true, ""},
		{"2606:2800:220:1::1", true, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			t.Parallel()
			a := netip.MustParseAddr(tt.addr)
			for _, c := range []struct {
				name string
				p    Policy
				ok   bool
			}{{"dev", dev, tt.devOK}, {"strict", strict, tt.strictOK}} {
				err := c.p.CheckAddr(a)
				if (err == nil) != c.ok {
					t.Errorf("%s policy: CheckAddr(%s) = %v, want allowed=%v", c.name, tt.addr, err, c.ok)
				}
				if err != nil {
					re, ok := AsError(err)
					if !ok || re.Reason != ReasonEndpoint || !strings.Contains(re.Detail, tt.wantDetailContains) {
						t.Errorf("%s policy: refusal %#v, want reason %s mentioning %q", c.name, err, ReasonEndpoint, tt.wantDetailContains)
					}
				}
			}
		})
	}
}

func TestCheckURL(t *testing.T) {
	t.Parallel()
	dev := Policy{AllowLoopback: true, AllowPrivate: true}
	tests := []struct {
		url string
		ok  bool
	}{
		{"http://169.254.169.254/latest/meta-data/", false},
		{"http://[fe80::1%25eth0]:8080/mcp", false},
		{"http://[fd00:ec2::254]/", false},
		{"http://metadata.google.internal/computeMetadata/v1/", false},
		{"http://METADATA.google.internal./", false},
		{"http://2852039166/", false}, // 169.254.169.254 in decimal
		{"http://0xa9.0xfe.0xa9.0xfe/", false},
		{"http://0251.0376.0251.0376/", false},
		{"http://127.1/", false},
		{"http://0/", false},
		{"http://127.0.0.1:8080/mcp", true},       // loopback allowed by dev
		{"http://sources.mcp.svc:8080/mcp", true}, // a name: decided at dial time
		{"https://1password.example/mcp", true},
		{"https://api.example.com/mcp", true},
	}
	for _, tt := range tests {
		if err := dev.CheckURL(tt.url); (err == nil) != tt.ok {
			t.Errorf("CheckURL(%s) = %v, want allowed=%v", tt.url, err, tt.ok)
		}
	}
	if err := (Policy{}).CheckURL("http://127.0.0.1:8080/mcp"); err == nil {
		t.Error("a strict policy allowed a loopback literal")
	}
}

// TestControlRefusesBeforeConnecting dials real listeners through a
// dialer whose Control is the policy: a refused address gets no connection.
func TestControlRefusesBeforeConnecting(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 10)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = lis.Close() })

	// "localhost" is a name: only the dial-time check sees that it
	// resolves to loopback.
	addr := strings.Replace(lis.Addr().String(), "127.0.0.1", "localhost", 1)
	_, err = (&net.Dialer{Control: Policy{}.Control}).Dial("tcp4", addr)
	if re, ok := AsError(err); !ok || re.Reason != ReasonEndpoint {
		t.Fatalf("dial %s under a strict policy: %v, want %s", addr, err, ReasonEndpoint)
	}
	c, err := (&net.Dialer{Control: Policy{AllowLoopback: true}.Control}).Dial("tcp4", addr)
	if err != nil {
		t.Fatalf("dial %s with loopback allowed: %v", addr, err)
	}
	_ = c.Close()
	<-accepted
	select {
	case <-accepted:
		t.Error("the refused dial reached the listener")
	default:
	}
	if err := (Policy{AllowLoopback: true, AllowPrivate: true}).Control("tcp4", "169.254.169.254:80", nil); err == nil {
		t.Error("Control allowed the metadata address")
	}
}

func TestCheckExecutable(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	outside := t.TempDir()
	work := filepath.Join(root, "work")
	writeExe := func(path string, mode os.FileMode) string {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("#!/bin/sh\nexit 0\n"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil { // umask-proof
			t.Fatal(err)
		}
		return path
	}
	good := writeExe(filepath.Join(root, "bin", "server"), 0o755)
	outsideExe := writeExe(filepath.Join(outside, "server"), 0o755)
	inWork := writeExe(filepath.Join(work, "conn_1", "planted"), 0o755)
	worldWritable := writeExe(filepath.Join(root, "bin", "ww"), 0o777)
	sharedDir := filepath.Join(root, "shared")
	sharedExe := writeExe(filepath.Join(sharedDir, "server"), 0o755)
	if err := os.Chmod(sharedDir, 0o777); err != nil {
		t.Fatal(err)
	}
	linkToSh := filepath.Join(root, "bin", "sh")
	if err := os.Symlink("/bin/sh", linkToSh); err != nil {
		t.Fatal(err)
	}
	linkToGood := filepath.Join(outside, "link")
	if err := os.Symlink(good, linkToGood); err != nil {
		t.Fatal(err)
	}
	resolvedGood, _ := filepath.EvalSymlinks(good)

	p := Policy{StdioRoots: []string{root, "/nonexistent/root"}, DenyDirs: []string{work}}
	tests := []struct {
		name, path string
		want       string // resolved path; "" means refused
		detail     string
	}{
		{"under a root", good, resolvedGood, ""},
		{"a symlink from outside to a file under a root", linkToGood, resolvedGood, ""},
		{"outside every root", outsideExe, "", "outside the stdio roots"},
		{"a symlink under a root to /bin/sh", linkToSh, "", "outside the stdio roots"},
		{"a shell", "/bin/sh", "", "outside the stdio roots"},
		{"relative", "bin/server", "", "neither an absolute path"},
		{"dot-dot escape", filepath.Join(root, "..", filepath.Base(outside), "server"), "", "outside the stdio roots"},
		{"in the work directory", inWork, "", "never started"},
		{"world-writable file", worldWritable, "", "writable by every user"},
		{"in a world-writable directory", sharedExe, "", "every user can write to"},
		{"a directory", filepath.Join(root, "bin"), "", "not a regular file"},
	}
	for _, tt := range tests {
		got, err := p.CheckExecutable(tt.path)
		if tt.want != "" {
			if err != nil || got != tt.want {
				t.Errorf("%s: CheckExecutable = %q, %v; want %q", tt.name, got, err, tt.want)
			}
			continue
		}
		re, ok := AsError(err)
		if !ok || re.Reason != ReasonExecutable || !strings.Contains(re.Detail, tt.detail) {
			t.Errorf("%s: CheckExecutable = %q, %v; want %s mentioning %q", tt.name, got, err, ReasonExecutable, tt.detail)
		}
	}
	if _, err := p.CheckExecutable(filepath.Join(root, "missing")); err == nil {
		t.Error("a missing executable passed")
	} else if _, ok := AsError(err); ok {
		t.Errorf("a missing executable is a refusal, want a plain error: %v", err)
	}
	// A file root allows exactly that file.
	exact := Policy{StdioRoots: []string{good}}
	if _, err := exact.CheckExecutable(good); err != nil {
		t.Errorf("file root: %v", err)
	}
	if _, err := exact.CheckExecutable(worldWritable); err == nil {
		t.Error("a file root allowed its sibling")
	}
	if _, err := (Policy{}).CheckExecutable(good); err == nil || !strings.Contains(err.Error(), "no stdio roots") {
		t.Errorf("no roots: %v", err)
	}
	if os.Geteuid() == 0 {
		foreign := writeExe(filepath.Join(root, "bin", "foreign"), 0o755)
		if err := os.Chown(foreign, 12345, 12345); err != nil {
			t.Fatal(err)
		}
		if _, err := p.CheckExecutable(foreign); err == nil || !strings.Contains(err.Error(), "another user") {
			t.Errorf("a file of another user: %v", err)
		}
	}
}

func TestCheckEnvName(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"LD_PRELOAD", "ld_library_path", "LD_AUDIT", "DYLD_INSERT_LIBRARIES", "GCONV_PATH"} {
		if re, ok := AsError(CheckEnvName(name)); !ok || re.Reason != ReasonEnv {
			t.Errorf("CheckEnvName(%s) allowed", name)
		}
	}
	for _, name := range []string{"PATH", "LOG_LEVEL", "HOLD_TIME"} {
		if err := CheckEnvName(name); err != nil {
			t.Errorf("CheckEnvName(%s) = %v", name, err)
		}
	}
}

func TestDefaultStdioRoots(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Skip(err)
	}
	p := Policy{StdioRoots: DefaultStdioRoots()}
	// The running executable is allowed by the default (v0m3 serves its
	// own fixture and renderer servers); the shell is not.
	if _, err := p.CheckExecutable(exe); err != nil {
		t.Errorf("the running executable is refused by the default roots: %v", err)
	}
	if _, err := p.CheckExecutable("/bin/sh"); err == nil {
		t.Error("the default roots allow /bin/sh")
	}
}
