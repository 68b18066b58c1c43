// Package reach is the one rule for what V0M3 may reach on a connection's
// behalf: which network addresses the adapter's MCP client may connect to,
// and which executables it may start as local (stdio) servers.
//
// The adapter enforces it at the last moment: Control runs inside every
// dial after DNS resolution (so a name that resolves, or re-resolves, to
// a refused address is refused too), and CheckExecutable runs on the
// resolved executable right before a process would start. The registry
// applies the same checks early, when a connection is created or updated,
// wherever they can be decided from the configuration alone (a literal IP,
// a known metadata name, an absolute executable path).
//
// Always refused, whatever the configuration: link-local addresses
// (169.254.0.0/16, fe80::/10), cloud metadata addresses and names, the
// unspecified, multicast and broadcast addresses, and numeric hosts that
// are not canonical IP literals (resolvers read "2852039166" or "0xa9.254"
// as addresses). Loopback and private ranges are refused unless the
// Policy allows them.
package reach

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ErrorInfo reasons of a refusal.
const (
	// ReasonEndpoint: a network endpoint the policy does not allow.
	ReasonEndpoint = "ENDPOINT_NOT_ALLOWED"
	// ReasonExecutable: an executable outside the stdio roots, or one that
	// cannot be trusted where it lies.
	ReasonExecutable = "EXECUTABLE_NOT_ALLOWED"
	// ReasonEnv: an environment variable that would make a local server
	// load code from outside its executable (LD_PRELOAD and the like).
	ReasonEnv = "ENV_NOT_ALLOWED"
)

// Policy says what may be reached. The zero value refuses every local
// executable, loopback and private address.
type Policy struct {
	// StdioRoots are the directories under which a local server's
	// executable must lie, after every symlink is resolved. An entry that
	// names a file allows exactly that file. Empty: no executable.
	StdioRoots []string
	// DenyDirs are directories under which no executable is allowed even
	// inside a root: places servers or callers can write to, such as the
	// adapter's working directory.
	DenyDirs []string
	// AllowLoopback permits loopback addresses (127.0.0.0/8, ::1): for
	// development and tests, where servers listen on the same host.
	AllowLoopback bool
	// AllowPrivate permits private addresses (10.0.0.0/8, 172.16.0.0/12,
	// 192.168.0.0/16, 100.64.0.0/10, fc00::/7): e.g. in-cluster services.
	AllowPrivate bool
}

// Error is a refusal. Its text is safe to show: it names the address,
// host or executable path (configuration, never a secret) and why.
type Error struct {
	// Reason is ReasonEndpoint, ReasonExecutable or ReasonEnv.
	Reason string
	// Detail says what was refused and why.
	Detail string
}

func (e *Error) Error() string { return e.Detail }

// AsError returns the refusal inside err, if any.
func AsError(err error) (*Error, bool) {
	var re *Error
	ok := errors.As(err, &re)
	return re, ok
}

func endpointErr(format string, args ...any) *Error {
	return &Error{Reason: ReasonEndpoint, Detail: fmt.Sprintf(format, args...)}
}

func executableErr(format string, args ...any) *Error {
	return &Error{Reason: ReasonExecutable, Detail: fmt.Sprintf(format, args...)}
}

// metadataAddrs are cloud instance metadata services. Most are link-local
// anyway; the others (AWS IPv6, Alibaba, Azure wireserver) are listed so
// no configuration can allow them.
var metadataAddrs = map[netip.Addr]string{
	netip.MustParseAddr("169.254.169.254"): "the cloud instance metadata address",
	netip.MustParseAddr("169.254.170.2"):   "the ECS task metadata address",
	netip.MustParseAddr("fd00:ec2::254"):   "the AWS IPv6 instance metadata address",
	netip.MustParseAddr("100.100.100.200"): "the Alibaba Cloud metadata address",
	netip.MustParseAddr("168.63.129.16"):   "the Azure host (wireserver) address",
}

// metadataNames are host names of metadata services.
var metadataNames = map[string]bool{
	"metadata.google.internal":   true,
	"metadata.goog":              true,
	"metadata":                   true,
	"instance-data":              true,
	"instance-data.ec2.internal": true,
	"metadata.azure.internal":    true,
}

var (
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")
	broadcast   = netip.MustParseAddr("255.255.255.255")
	sharedSpace = netip.MustParsePrefix("100.64.0.0/10") // carrier-grade NAT, used for cluster networks too
	nat64       = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour   = netip.MustParsePrefix("2002::/16")
)

// CheckAddr decides one IP address.
func (p Policy) CheckAddr(a netip.Addr) error {
	a = a.WithZone("").Unmap()
	// An IPv6 address that embeds an IPv4 one reaches it through a
	// gateway: it is decided as what it reaches, too.
	if a.Is6() {
		b := a.As16()
		switch {
		case nat64.Contains(a):
			if err := p.CheckAddr(netip.AddrFrom4([4]byte(b[12:16]))); err != nil {
				return err
			}
		case sixToFour.Contains(a):
			if err := p.CheckAddr(netip.AddrFrom4([4]byte(b[2:6]))); err != nil {
				return err
			}
		}
	}
	if what, ok := metadataAddrs[a]; ok {
		return endpointErr("%s is %s; it is never reachable from connections", a, what)
	}
	switch {
	case !a.IsValid():
		return endpointErr("not an IP address")
	case a.IsUnspecified() || (a.Is4() && thisNetwork.Contains(a)):
		return endpointErr("%s is not a host address (it reaches this host); it is never reachable from connections", a)
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast():
		return endpointErr("%s is link-local; link-local addresses are never reachable from connections", a)
	case a.IsMulticast() || a.IsInterfaceLocalMulticast() || a == broadcast:
		return endpointErr("%s is a multicast or broadcast address, not a server", a)
	case a.IsLoopback():
		if !p.AllowLoopback {
			return endpointErr("%s is a loopback address; this platform does not allow loopback endpoints (allow loopback only for development)", a)
		}
	case a.IsPrivate() || (a.Is4() && sharedSpace.Contains(a)):
		if !p.AllowPrivate {
			return endpointErr("%s is a private-network address; this platform does not allow private endpoints (allow private networks to reach in-cluster servers)", a)
		}
	}
	return nil
}

// Control is a net.Dialer Control function: it refuses, after DNS
// resolution and before any packet is sent, a connection to an address
// the policy does not allow.
func (p Policy) Control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return endpointErr("cannot tell which address %q is", address)
	}
	return p.CheckAddr(ap.Addr())
}

// CheckURL decides what can be decided from an endpoint URL alone: a
// literal IP address, a metadata host name, a numeric host that is not a
// canonical IP. Other names pass here and are decided by Control when
// they are dialled.
func (p Policy) CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return endpointErr("not a URL")
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if metadataNames[host] {
		return endpointErr("%s names a cloud metadata service; it is never reachable from connections", host)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return p.CheckAddr(a)
	}
	if numericHost(host) {
		return endpointErr("host %q is numeric but not a canonical IP address; resolvers may read it as an address, so write the address in dotted form", host)
	}
	return nil
}

// numericHost reports whether host looks like an IPv4 address in one of
// the forms inet_aton accepts (decimal, octal or hex parts, fewer than four
// parts), which name no DNS host.
func numericHost(host string) bool {
	if host == "" || host[0] < '0' || host[0] > '9' {
		return false
	}
	for _, c := range host {
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f', c == 'x', c == '.':
		default:
			return false
		}
	}
	return true
}

// CheckExecutable decides a local server's executable. path must be
// absolute (the adapter resolves a bare command name against the server's
// PATH first). Every symlink is resolved, and the resolved file must lie
// under a root, outside every DenyDirs entry, and be trustworthy where it
// lies: a regular file owned by root or by this process's user and not
// writable by others, in directories below the root that others cannot
// write to. It returns the resolved path, which is what must be executed.
//
// An executable that does not exist is a plain error, not a refusal.
func (p Policy) CheckExecutable(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", executableErr("executable %q is neither an absolute path nor a bare name; relative paths depend on the adapter's working directory", path)
	}
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("resolve executable %s: %w", path, err)
	}
	fi, err := os.Stat(resolved)
	if err != nil {
		return "", fmt.Errorf("resolve executable %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return "", executableErr("executable %s is not a regular file", resolved)
	}
	for _, d := range p.DenyDirs {
		if rd, err := filepath.EvalSymlinks(d); err == nil && within(rd, resolved) {
			return "", executableErr("executable %s lies in %s, where servers and callers can write; it is never started", resolved, d)
		}
	}
	root := ""
	for _, r := range p.StdioRoots {
		rr, err := filepath.EvalSymlinks(r)
		if err != nil {
			continue
		}
		if rr == resolved || within(rr, resolved) {
			root = rr
			break
		}
	}
	if root == "" {
		if len(p.StdioRoots) == 0 {
			return "", executableErr("executable %s: this platform allows no local (stdio) servers (no stdio roots are configured)", resolved)
		}
		return "", executableErr("executable %s lies outside the stdio roots this platform allows (%s); install the server under one of them or ask the platform team to add a root",
			resolved, strings.Join(p.StdioRoots, ", "))
	}
	if err := trusted(root, resolved, fi); err != nil {
		return "", err
	}
	return resolved, nil
}

// within reports whether path lies strictly inside dir (both resolved).
func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// trusted checks that nobody but root and this user could have placed or
// changed the executable: the file, and every directory between the root
// and the file (a root such as the temp directory may itself be shared).
func trusted(root, resolved string, fi os.FileInfo) error {
	if err := trustedOwner(fi); err != nil {
		return executableErr("executable %s %s", resolved, err)
	}
	if fi.Mode().Perm()&0o002 != 0 {
		return executableErr("executable %s is writable by every user; it is never started", resolved)
	}
	for dir := filepath.Dir(resolved); within(root, dir); dir = filepath.Dir(dir) {
		di, err := os.Stat(dir)
		if err != nil {
			return fmt.Errorf("check %s: %w", dir, err)
		}
		if di.Mode().Perm()&0o002 != 0 && di.Mode()&os.ModeSticky == 0 {
			return executableErr("executable %s lies in %s, which every user can write to; it is never started", resolved, dir)
		}
		if err := trustedOwner(di); err != nil {
			return executableErr("directory %s of executable %s %s", dir, resolved, err)
		}
	}
	return nil
}

// CheckEnvName refuses environment variables that make the dynamic loader
// run code from outside the executable: with them, an allowed executable
// would run a library from anywhere.
func CheckEnvName(name string) error {
	upper := strings.ToUpper(name)
	if strings.HasPrefix(upper, "LD_") || strings.HasPrefix(upper, "DYLD_") || upper == "GCONV_PATH" {
		return &Error{Reason: ReasonEnv, Detail: fmt.Sprintf("environment variable %s changes which code the dynamic loader runs; it is never passed to local servers", name)}
	}
	return nil
}

// DefaultStdioRoots are the development default: the running executable
// itself (the v0m3 binary serves the fixture and renderer servers), the
// user cache directory's v0m3 folder (servers installed from npm by
// scripts/third-party-mcp.sh), and the system temp directory (test
// builds). Everything found there must still pass the ownership checks of
// CheckExecutable. A production platform configures its own roots.
func DefaultStdioRoots() []string {
	var roots []string
	if exe, err := os.Executable(); err == nil {
		roots = append(roots, exe)
	}
	if c, err := os.UserCacheDir(); err == nil {
		roots = append(roots, filepath.Join(c, "v0m3"))
	}
	return append(roots, os.TempDir())
}
