package adapter

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/serving"
)

// maxVersionBytes bounds the protocol version a server named that the
// adapter repeats in errors and logs: it is remote text.
const maxVersionBytes = 64

// versionError is a server that answered initialize with a protocol
// version the adapter does not speak.
type versionError struct {
	// version is what the server said, scrubbed of credentials and
	// truncated; empty when it could not be read.
	version string
}

// fact is the adapter's own account: which versions it speaks.
func (v *versionError) fact() string {
	return fmt.Sprintf("the server answered initialize with a protocol version this adapter does not support; supported: %s",
		strings.Join(mcp.SupportedProtocolVersions(), ", "))
}

// status is the gRPC error of a discovery that met the server.
func (v *versionError) status(connectionID string) error {
	return apierror.New(codes.FailedPrecondition, CodeProtocolVersionUnsupported,
		fmt.Sprintf("connection %s answered initialize with protocol version %q, which this adapter does not support (it speaks %s); nothing was listed. Upgrade or reconfigure the server",
			connectionID, v.version, strings.Join(mcp.SupportedProtocolVersions(), ", ")),
		map[string]string{"connection_id": connectionID, "server_version": v.version})
}

// healthDetail is a health check's detail: the reason, then the version.
func (v *versionError) healthDetail() string {
	return fmt.Sprintf("%s: the server answered initialize with protocol version %q", CodeProtocolVersionUnsupported, v.version)
}

// unsupportedVersion returns the versionError err carries, or nil. The
// client library refuses such a server with an unexported error type,
// found here by name; its version is read from err's text, which the
// session has already scrubbed of credentials.
func unsupportedVersion(err error) *versionError {
	if !hasSDKError(err, "unsupportedProtocolVersionError") {
		return nil
	}
	const prefix = "unsupported protocol version: "
	v := &versionError{}
	if _, rest, ok := strings.Cut(err.Error(), prefix); ok {
		if q, qerr := strconv.QuotedPrefix(rest); qerr == nil {
			if s, uerr := strconv.Unquote(q); uerr == nil {
				v.version = truncate(s, maxVersionBytes)
			}
		}
	}
	return v
}

// hasSDKError reports whether err's tree holds an error of the go-sdk mcp
// package's type of the given name.
func hasSDKError(err error, name string) bool {
	mcpPkg := reflect.TypeFor[mcp.Implementation]().PkgPath()
	for stack := []error{err}; len(stack) > 0; {
		e := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if e == nil {
			continue
		}
		if t := reflect.TypeOf(e); t.PkgPath() == mcpPkg && t.Name() == name {
			return true
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			stack = append(stack, u.Unwrap())
		case interface{ Unwrap() []error }:
			stack = append(stack, u.Unwrap()...)
		}
	}
	return false
}

// statelessVersion is the first protocol version a session starts with
// server/discover instead of initialize.
const statelessVersion = "2026-07-28"

// legacyTTL is how long the adapter remembers that a connection's server
// speaks only the initialize handshake: a remote server may be upgraded
// in place, without a new config revision.
const legacyTTL = time.Hour

// legacyServers remembers, per connection and serving revision, that its
// server answered server/discover with an error and was spoken to
// through initialize: the next session starts with initialize at once,
// one round trip less for every new session to such a server.
type legacyServers struct {
	mu    sync.Mutex
	until map[string]time.Time
}

func legacyKey(conn *registryv1.Connection) string {
	return fmt.Sprintf("%s@%d", conn.GetId(), serving.Revision(conn))
}

// sessionOptions are the options of a new session to conn's server: nil
// (try server/discover first) unless the server is known to speak only
// initialize.
func (l *legacyServers) sessionOptions(conn *registryv1.Connection, now time.Time) *mcp.ClientSessionOptions {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.until[legacyKey(conn)]) {
		return &mcp.ClientSessionOptions{ProtocolVersion: latestLegacyVersion()}
	}
	return nil
}

// observe records what a session that tried server/discover first
// negotiated: a version before the stateless one means the server did
// not take server/discover.
func (l *legacyServers) observe(conn *registryv1.Connection, negotiated string, now time.Time) bool {
	if negotiated == "" || negotiated >= statelessVersion {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.until == nil {
		l.until = map[string]time.Time{}
	}
	for k, t := range l.until {
		if !now.Before(t) {
			delete(l.until, k) // expired entries go, so the map stays as small as the live connections
		}
	}
	l.until[legacyKey(conn)] = now.Add(legacyTTL)
	return true
}

// latestLegacyVersion is the newest protocol version the client library
// speaks through initialize.
func latestLegacyVersion() string {
	best := ""
	for _, v := range mcp.SupportedProtocolVersions() {
		if v < statelessVersion && v > best {
			best = v
		}
	}
	return best
}
