package adapter

import (
	"context"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/digest"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// readings keeps, per connection, the last reading of it from the registry
// that passed the adapter's checks (not retired, reviewed), with its
// digest. Execute's caller authorizes each call on a reading of the
// connection it made in that call (RegistryService/ResolveExecution) and
// sends its digest (ExecuteRequest.connection_digest): when the two
// digests are equal, the adapter's checks already passed on exactly the
// state the caller found current, and asking the registry again would
// only repeat that read a few milliseconds later. When they differ (the
// connection changed, another build encoded it, or the caller sent none),
// the adapter reads the connection and checks it as before. One entry per
// connection: the map is bounded by the registry's connections.
type readings struct {
	mu sync.Mutex
	m  map[string]reading
}

type reading struct {
	conn   *registryv1.Connection
	digest string
}

// get returns the kept reading of id whose digest is want, as the caller's
// own copy, or nil.
func (r *readings) get(id, want string) *registryv1.Connection {
	if want == "" {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.m[id]; ok && e.digest == want {
		return proto.CloneOf(e.conn)
	}
	return nil
}

// put keeps conn, which passed the checks, as id's reading.
func (r *readings) put(conn *registryv1.Connection) {
	d, err := digest.Message(conn)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]reading{}
	}
	r.m[conn.GetId()] = reading{conn: proto.CloneOf(conn), digest: d}
}

// forget drops id's reading: it failed a check, or is gone.
func (r *readings) forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, id)
}

// executeConnection is connection for Execute: the kept reading when the
// request names its digest, else a fresh one from the registry (kept when
// it passes the checks).
func (s *Server) executeConnection(ctx context.Context, req *adapterv1.ExecuteRequest) (*registryv1.Connection, error) {
	if c := s.readings.get(req.GetConnectionId(), req.GetConnectionDigest()); c != nil {
		return c, nil
	}
	return s.connection(ctx, req.GetConnectionId())
}
