package registry

import (
	"context"
	"fmt"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// ReportSandbox records the sandbox the adapter applied to a connection's
// local server. It is the adapter's own RPC, narrower than UpdateConnection
// (which the adapter may no longer call): it writes the connection's
// sandbox field and its update time, nothing else, and creates no config
// revision. It is a compare-and-set on the config revision the adapter
// started the server from, so a concurrent reconfiguration wins and the
// next start reports again.
func (s *Server) ReportSandbox(ctx context.Context, req *registryv1.ReportSandboxRequest) (*registryv1.Connection, error) {
	// The access table admits the adapter alone; a server run without the
	// guard (a test's, a misconfigured one) still lets nobody else write
	// what the adapter observed.
	if c, ok := identity.CallerFrom(ctx); !ok || c.Kind != identity.KindService || c.ID != identity.Adapter {
		return nil, apierror.New(codes.PermissionDenied, "PEER_NOT_ALLOWED",
			"ReportSandbox may be called only by the adapter service, which applies the sandbox it reports",
			map[string]string{"allowed_peers": identity.Adapter})
	}
	var v []apierror.FieldViolation
	if req.GetConnectionId() == "" {
		v = append(v, apierror.FieldViolation{Field: "connection_id", Description: "the connection id is required"})
	}
	if req.GetConfigRevision() <= 0 {
		v = append(v, apierror.FieldViolation{Field: "config_revision", Description: "the config revision the server was started from (>= 1) is required"})
	}
	if req.GetSandbox() == nil {
		v = append(v, apierror.FieldViolation{Field: "sandbox", Description: "the sandbox constraints applied are required"})
	}
	if len(v) > 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldRequired, "invalid sandbox report: "+violationText(v), v...)
	}
	var out *registryv1.Connection
	err := s.updateConnection(ctx, req.GetConnectionId(), func(u *ConnectionUpdate) error {
		c := u.Connection
		out = c
		switch {
		case c.GetState() == registryv1.ConnectionState_CONNECTION_STATE_RETIRED:
			return connectionRetired(c)
		case c.GetConfigRevision() != req.GetConfigRevision():
			return apierror.New(codes.Aborted, "CONFIG_REVISION_CONFLICT",
				fmt.Sprintf("connection %s is at config revision %d, not %d; the next start of its server reports its sandbox again",
					c.GetId(), c.GetConfigRevision(), req.GetConfigRevision()),
				map[string]string{"connection_id": c.GetId(), "config_revision": strconv.FormatInt(c.GetConfigRevision(), 10)})
		case proto.Equal(c.GetSandbox(), req.GetSandbox()):
			return nil
		}
		c.Sandbox = proto.CloneOf(req.GetSandbox())
		c.UpdateTime = s.timestamp()
		u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONNECTION_UPDATED, c.GetId(), "", "",
			"sandbox observed by the adapter; no new config revision"))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
