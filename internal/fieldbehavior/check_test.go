package fieldbehavior_test

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/fieldbehavior"
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
	if !apierror.Is(err, codes.InvalidArgument, fieldbehavior.ReasonFieldRequired) {
		t.Fatalf("Check = %v; want INVALID_ARGUMENT %s", err, fieldbehavior.ReasonFieldRequired)
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
