package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/resultschema"
)

// FixtureMode says what the adapter does with its fixture directory.
type FixtureMode int

// Fixture modes.
const (
	// FixturesOff: live calls only; no fixture is read or written.
	FixturesOff FixtureMode = iota
	// FixturesRecord: live calls, and every discovery and every answered
	// call is written as a sanitized fixture.
	FixturesRecord
	// FixturesReplay: no server is ever launched or contacted and no
	// credential is ever resolved. Discovery and calls are answered from
	// fixtures matched by call identity; an unknown call fails with
	// MISSING_FIXTURE and never falls through to live execution.
	FixturesReplay
)

// CodeMissingFixture is the safe code (and error reason) of a replayed
// call with no recorded fixture.
const CodeMissingFixture = "MISSING_FIXTURE"

// CodeFixtureBindingMismatch is the safe code of a replayed call whose
// fixture was recorded against another config revision or schema.
const CodeFixtureBindingMismatch = "FIXTURE_BINDING_MISMATCH"

// Fixtures configures record/replay.
//
// Fixtures are files in Dir, one per call identity, named
// "<kind>-<hex>.json" where hex is the digest of the identity. Each file is
// canonical JSON (RFC 8785) holding:
//   - identity: what is matched. Discovery: the connection's configuration
//     fingerprint. A call: the fingerprint, the method, the target and the
//     canonical digest of the remote arguments.
//   - binding: what the fixture is bound to and replay checks: the config
//     revision and, for a tool call, the digest of the tool's input schema
//     in the snapshot the call was authorized against.
//   - provenance: the connection id it was recorded from (connection ids
//     are local to one registry; the fingerprint is what identifies the
//     configured server across registries) and the safe arguments.
//   - the recorded snapshot or response, with the connection's credential
//     value (if any appeared) replaced by "[redacted]".
//
// The configuration fingerprint is the digest of the transport as
// configured (output-only executable evidence excluded), the image digest
// and the credential reference (never the credential).
type Fixtures struct {
	// Dir holds the fixture files.
	Dir string
	// Mode is off, record or replay.
	Mode FixtureMode
}

// fixtureFile is the on-disk shape of one fixture.
type fixtureFile struct {
	Version    int            `json:"version"`
	Kind       string         `json:"kind"`
	Identity   map[string]any `json:"identity"`
	Binding    map[string]any `json:"binding"`
	Provenance map[string]any `json:"provenance"`
	Snapshot   any            `json:"snapshot,omitempty"`
	Response   any            `json:"response,omitempty"`
}

// configFingerprint identifies what a connection is configured to reach.
func configFingerprint(conn *registryv1.Connection) (string, error) {
	t := proto.CloneOf(conn.GetTransport())
	if st := t.GetStdio(); st != nil {
		st.ExecutableDigest = ""
	}
	tj, err := protojson.Marshal(t)
	if err != nil {
		return "", err
	}
	var tv any
	if err := json.Unmarshal(tj, &tv); err != nil {
		return "", err
	}
	return digest.JSON(map[string]any{
		"transport":      tv,
		"image_digest":   conn.GetImageDigest(),
		"credential_ref": conn.GetCredentialRef(),
	})
}

// discoveryIdentity returns the identity of a connection's discovery.
func discoveryIdentity(conn *registryv1.Connection) (map[string]any, error) {
	fp, err := configFingerprint(conn)
	if err != nil {
		return nil, err
	}
	return map[string]any{"kind": "discover", "config_fingerprint": fp}, nil
}

// callIdentity returns the identity of one call.
func callIdentity(conn *registryv1.Connection, req *adapterv1.ExecuteRequest, method string) (map[string]any, error) {
	fp, err := configFingerprint(conn)
	if err != nil {
		return nil, err
	}
	args := req.GetArguments()
	argsDigest, err := digest.JSON(args.AsMap())
	if err != nil {
		return nil, err
	}
	return map[string]any{
		"kind":               "call",
		"config_fingerprint": fp,
		"method":             method,
		"target_kind":        req.GetTarget().GetKind().String(),
		"target_name":        req.GetTarget().GetName(),
		"arguments_digest":   argsDigest,
	}, nil
}

// fixturePath names the file of an identity.
func (f *Fixtures) fixturePath(identity map[string]any) (string, error) {
	d, err := digest.JSON(identity)
	if err != nil {
		return "", err
	}
	return filepath.Join(f.Dir, fmt.Sprintf("%s-%s.json", identity["kind"], strings.TrimPrefix(d, "sha256:"))), nil
}

// load reads the fixture of an identity; fs.ErrNotExist when none.
func (f *Fixtures) load(identity map[string]any) (*fixtureFile, error) {
	p, err := f.fixturePath(identity)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var ff fixtureFile
	if err := json.Unmarshal(b, &ff); err != nil {
		return nil, fmt.Errorf("fixture %s: %w", filepath.Base(p), err)
	}
	return &ff, nil
}

// remarshal turns a JSON-decoded value back into a message.
func remarshal(v any, m proto.Message) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return protojson.Unmarshal(b, m)
}

// replayDiscover answers a discovery from its fixture.
func (s *Server) replayDiscover(conn *registryv1.Connection) (*registryv1.DiscoverySnapshot, error) {
	id, err := discoveryIdentity(conn)
	if err != nil {
		return nil, err
	}
	ff, err := s.fixtures.load(id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, apierror.New(codes.FailedPrecondition, CodeMissingFixture,
			fmt.Sprintf("replay: no discovery fixture for connection %s; record one first (the adapter never contacts a server in replay mode)", conn.GetId()),
			map[string]string{"connection_id": conn.GetId()})
	}
	if err != nil {
		return nil, apierror.New(codes.Internal, "FIXTURE_UNREADABLE", "replay: the discovery fixture could not be read", nil)
	}
	if rev, _ := ff.Binding["config_revision"].(float64); int64(rev) != conn.GetConfigRevision() {
		return nil, apierror.New(codes.FailedPrecondition, CodeFixtureBindingMismatch,
			fmt.Sprintf("replay: the discovery fixture was recorded at config revision %d, connection %s is at %d", int64(rev), conn.GetId(), conn.GetConfigRevision()),
			map[string]string{"connection_id": conn.GetId()})
	}
	snap := &registryv1.DiscoverySnapshot{}
	if err := remarshal(ff.Snapshot, snap); err != nil {
		return nil, apierror.New(codes.Internal, "FIXTURE_UNREADABLE", "replay: the discovery fixture could not be decoded", nil)
	}
	return snap, nil
}

// replayExecute answers a call from its fixture, or fails it with
// MISSING_FIXTURE (nothing sent: outcome UNAVAILABLE, stage PREPARED).
// A recorded result is judged by the output schema of the request being
// replayed, as a live one would be.
func (s *Server) replayExecute(ctx context.Context, conn *registryv1.Connection, req *adapterv1.ExecuteRequest, schema *resultschema.Schema) *adapterv1.ExecuteResponse {
	method := callMethod(conn, req)
	resp := &adapterv1.ExecuteResponse{Method: method, Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED}
	id, err := callIdentity(conn, req, method)
	if err != nil {
		return fail(resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeMissingFixture, "")
	}
	ff, err := s.fixtures.load(id)
	if err != nil {
		s.log.Warn("replay: no fixture for call", "connection_id", conn.GetId(), "attempt_id", req.GetAttemptId(), "method", method)
		return fail(resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeMissingFixture, "")
	}
	want, err := s.callBinding(ctx, conn, req)
	if err != nil || !sameBinding(ff.Binding, want) {
		s.log.Warn("replay: fixture bound to another config revision or schema", "connection_id", conn.GetId(), "attempt_id", req.GetAttemptId())
		return fail(resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeFixtureBindingMismatch, "")
	}
	out := &adapterv1.ExecuteResponse{}
	if err := remarshal(ff.Response, out); err != nil {
		return fail(resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, "FIXTURE_UNREADABLE", "")
	}
	now := timestamppb.Now()
	if out.SendTime != nil {
		out.SendTime = now
	}
	if out.ObserveTime != nil {
		out.ObserveTime = now
	}
	if out.GetOutcome() == adapterv1.Outcome_OUTCOME_OK && req.GetTarget().GetKind() == registryv1.RemoteKind_REMOTE_KIND_TOOL {
		if err := checkStructured(out.GetStructuredContent(), schema); err != nil {
			return contentFailed(out, err)
		}
	}
	return out
}

// callBinding is what a call's fixture is bound to: the config revision and
// the input schema digest of the target in the call's snapshot.
func (s *Server) callBinding(ctx context.Context, conn *registryv1.Connection, req *adapterv1.ExecuteRequest) (map[string]any, error) {
	b := map[string]any{"config_revision": float64(conn.GetConfigRevision()), "input_schema_digest": ""}
	if req.GetTarget().GetKind() != registryv1.RemoteKind_REMOTE_KIND_TOOL || req.GetSnapshotId() == "" {
		return b, nil
	}
	snap, err := s.deps.Registry.GetSnapshot(ctx, &registryv1.GetSnapshotRequest{Id: req.GetSnapshotId()})
	if err != nil {
		return nil, err
	}
	for _, t := range snap.GetTools() {
		if t.GetName() == req.GetTarget().GetName() {
			b["input_schema_digest"] = t.GetInputSchemaDigest()
		}
	}
	return b, nil
}

func sameBinding(a, b map[string]any) bool {
	da, err1 := digest.JSON(a)
	db, err2 := digest.JSON(b)
	return err1 == nil && err2 == nil && da == db
}

// callMethod is the method a call uses on a connection's transport.
func callMethod(conn *registryv1.Connection, req *adapterv1.ExecuteRequest) string {
	prefix := ""
	if conn.GetTransport().GetDirect() != nil {
		prefix = "direct/"
	}
	if req.GetTarget().GetKind() == registryv1.RemoteKind_REMOTE_KIND_RESOURCE {
		return prefix + "resources/read"
	}
	return prefix + "tools/call"
}
