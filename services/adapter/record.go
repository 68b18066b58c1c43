package adapter

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/redact"
)

// recordDiscovery writes the fixture of a live discovery. A failure is
// logged: the discovery itself succeeded.
func (s *Server) recordDiscovery(conn *registryv1.Connection, snap *registryv1.DiscoverySnapshot) {
	id, err := discoveryIdentity(conn)
	if err == nil {
		err = s.writeFixture(conn, &fixtureFile{
			Version: 1, Kind: "discover", Identity: id,
			Binding:    map[string]any{"config_revision": float64(conn.GetConfigRevision())},
			Provenance: map[string]any{"connection_id": conn.GetId(), "recorded_at": time.Now().UTC().Format(time.RFC3339)},
		}, snap, nil)
	}
	if err != nil {
		s.log.Warn("record discovery fixture", "connection_id", conn.GetId(), "error", logText(err))
	}
}

// recordExecute writes the fixture of a live call the server answered
// (a result or the server's own error). Calls that never reached an answer
// are not fixtures: replaying a broken transport proves nothing.
func (s *Server) recordExecute(ctx context.Context, conn *registryv1.Connection, req *adapterv1.ExecuteRequest, resp *adapterv1.ExecuteResponse) {
	if resp.GetStage() < adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED {
		return
	}
	id, err := callIdentity(conn, req, resp.GetMethod())
	var binding map[string]any
	if err == nil {
		binding, err = s.callBinding(ctx, conn, req)
	}
	if err == nil {
		safe, _ := protojson.Marshal(redact.Struct(req.GetArguments()))
		var safeArgs any
		_ = json.Unmarshal(safe, &safeArgs)
		err = s.writeFixture(conn, &fixtureFile{
			Version: 1, Kind: "call", Identity: id, Binding: binding,
			Provenance: map[string]any{"connection_id": conn.GetId(), "safe_arguments": safeArgs, "recorded_at": time.Now().UTC().Format(time.RFC3339)},
		}, nil, resp)
	}
	if err != nil {
		s.log.Warn("record call fixture", "connection_id", conn.GetId(), "attempt_id", req.GetAttemptId(), "error", logText(err))
	}
}

// writeFixture sanitizes and writes one fixture as canonical JSON,
// atomically. The connection's credential is resolved here only to make
// sure its value appears nowhere in the file.
func (s *Server) writeFixture(conn *registryv1.Connection, ff *fixtureFile, snap *registryv1.DiscoverySnapshot, resp *adapterv1.ExecuteResponse) error {
	var msg proto.Message = snap
	if resp != nil {
		r := proto.CloneOf(resp)
		msg = r
	}
	b, err := protojson.Marshal(msg)
	if err != nil {
		return err
	}
	// Defense in depth: what a session hands out is scrubbed already.
	creds := s.newCredentials(conn)
	if _, err := creds.resolve(conn.GetCredentialRef()); err == nil {
		b = creds.jsonText(b)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if snap != nil {
		ff.Snapshot = v
	} else {
		ff.Response = v
	}
	raw, err := json.Marshal(ff)
	if err != nil {
		return err
	}
	canon, err := digest.Canonical(raw)
	if err != nil {
		return err
	}
	path, err := s.fixtures.fixturePath(ff.Identity)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.fixtures.Dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.fixtures.Dir, ".tmp-")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(append(canon, '\n')); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write fixture %s: %w", filepath.Base(path), err)
	}
	return nil
}
