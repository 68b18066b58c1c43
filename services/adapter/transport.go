package adapter

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
)

// dialer opens MCP transports to one connection's server. One file per
// transport kind implements it.
type dialer interface {
	// open returns a transport whose inbound bytes are counted and limited
	// by m, and a release function that must be called after the session
	// is closed: it ends the server process (stdio) and frees resources.
	open(ctx context.Context, m *meter) (mcp.Transport, func(), error)
}

// dialerFor returns the dialer of a connection's transport.
// Dialers resolve the connection's credential through creds, so the
// session can scrub it from everything the server sends, and check the
// connection against the reachability policy before anything starts or
// is sent.
// listen says the session is long-lived: it should hear what the server
// says outside any call.
func (s *Server) dialerFor(conn *registryv1.Connection, creds *credentials, listen bool) (dialer, error) {
	switch t := conn.GetTransport().GetKind().(type) {
	case *registryv1.Transport_Stdio:
		return &stdioDialer{spec: t.Stdio, workRoot: s.workDir, connectionID: conn.GetId(), credentialRef: conn.GetCredentialRef(), creds: creds, reach: s.reach, sx: s.sandbox, log: s.log, starts: &s.procStarts, live: &s.procLive}, nil
	case *registryv1.Transport_StreamableHttp:
		return &httpDialer{url: t.StreamableHttp.GetUrl(), base: s.httpTransport, credentialRef: conn.GetCredentialRef(), creds: creds, reach: s.reach, listen: listen,
			oauth: s.authorizerFor(conn, t.StreamableHttp.GetUrl())}, nil
	case *registryv1.Transport_Direct:
		return nil, apierror.New(codes.FailedPrecondition, "TRANSPORT_NOT_SUPPORTED",
			fmt.Sprintf("connection %s uses the direct adapter %q, which this adapter does not run", conn.GetId(), t.Direct.GetAdapter()),
			map[string]string{"connection_id": conn.GetId()})
	default:
		return nil, apierror.New(codes.FailedPrecondition, "TRANSPORT_MISSING",
			fmt.Sprintf("connection %s has no transport configured", conn.GetId()),
			map[string]string{"connection_id": conn.GetId()})
	}
}
