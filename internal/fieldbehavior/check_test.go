package fieldbehavior_test

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/fieldbehavior"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestCheckNamesEveryMissingField: one refusal lists every missing field,
// nested ones by their path, in the message a person reads and in the
// BadRequest a program reads; a sub-message left unset is not looked into.
func TestCheckNamesEveryMissingField(t *testing.T) {
	t.Parallel()
	err := fieldbehavior.Check(&registryv1.ProposeMappingRequest{
		Capability:  "retrieve_authorized_source",
		Target:      &registryv1.RemoteTarget{Name: "search"},
		Limits:      &registryv1.Limits{MaxItems: 5},
		ArgumentMap: []*registryv1.ArgumentBinding{{RemoteField: "q"}, {}},
	})
	if !apierror.Is(err, codes.InvalidArgument, apierror.ReasonFieldRequired) {
		t.Fatalf("Check = %v; want INVALID_ARGUMENT %s", err, apierror.ReasonFieldRequired)
	}
	want := []string{"argument_map[1].remote_field", "connection_id", "limits.max_response_bytes", "snapshot_id"}
	if got := apierror.Fields(err); !slices.Equal(got, want) {
		t.Errorf("fields %v; want %v", got, want)
	}
	const msg = "connection_id, snapshot_id, argument_map[1].remote_field and limits.max_response_bytes are required"
	if got := status.Convert(err).Message(); got != msg {
		t.Errorf("message %q; want %q", got, msg)
	}
	// on_behalf_of (a Principal) and the scope are optional; an empty
	// scope entry's uri is still required.
	if err := fieldbehavior.Check(&orchestratorv1.StartTaskRequest{Profile: "source_review"}); err != nil {
		t.Errorf("a request with nothing required missing: %v", err)
	}
	err = fieldbehavior.Check(&orchestratorv1.StartTaskRequest{Profile: "source_review", SourceScope: []*orchestratorv1.SourceRef{{Uri: "file:///a"}, {}}})
	if got := apierror.Fields(err); !slices.Equal(got, []string{"source_scope[1].uri"}) {
		t.Errorf("a scope entry without a uri: %v; want source_scope[1].uri named", err)
	}
}

// TestOutputOnlyFieldsAreIgnored: a request's OUTPUT_ONLY fields, at any
// depth, are cleared before the handler sees it (AIP-203: ignored, not
// refused), and everything else arrives as sent.
func TestOutputOnlyFieldsAreIgnored(t *testing.T) {
	t.Parallel()
	sent := &evidencev1.AppendAuditRecordRequest{Record: &evidencev1.AuditRecord{
		Id: "aud_forged", Sequence: 7, RecordedBy: "orchestrator",
		Principal: "alice", Action: "connection.create", Resource: "connection:c1", Outcome: "ok",
	}}
	var got *evidencev1.AppendAuditRecordRequest
	_, err := fieldbehavior.UnaryServer()(t.Context(), sent, &grpc.UnaryServerInfo{FullMethod: "/v0m3.evidence.v1.EvidenceService/AppendAuditRecord"},
		func(_ context.Context, req any) (any, error) {
			got = req.(*evidencev1.AppendAuditRecordRequest)
			return &evidencev1.AuditRecord{}, nil
		})
	if err != nil {
		t.Fatalf("a request with output-only fields set: %v; want it handled", err)
	}
	want := &evidencev1.AppendAuditRecordRequest{Record: &evidencev1.AuditRecord{
		Principal: "alice", Action: "connection.create", Resource: "connection:c1", Outcome: "ok",
	}}
	if !proto.Equal(got, want) {
		t.Errorf("the handler got %v; want %v", got, want)
	}

	snap := &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{
		Id: "snap_forged", ConnectionId: "c1", ConfigRevision: 1,
		Tools: []*registryv1.ToolIdentity{{Name: "search", InputSchemaDigest: "sha256:forged"}},
	}}
	fieldbehavior.ClearOutputOnly(snap)
	if snap.GetSnapshot().GetId() != "" || snap.GetSnapshot().GetTools()[0].GetInputSchemaDigest() != "" {
		t.Errorf("output-only id and digest survived: %v", snap)
	}
	if snap.GetSnapshot().GetTools()[0].GetName() != "search" || snap.GetSnapshot().GetConnectionId() != "c1" {
		t.Errorf("ClearOutputOnly cleared more than the output-only fields: %v", snap)
	}
}
