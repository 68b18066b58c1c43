package adapter

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/services/internal/apierror"
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
