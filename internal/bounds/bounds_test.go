package bounds_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/bounds"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

var testLimits = bounds.Limits{
	Bytes:   map[string]int{"description": bounds.Long, "name": bounds.Name, "groups": bounds.Name, "source_scope": bounds.URI},
	Entries: map[string]int{"tools": 5},
}

func TestLimitsCheck(t *testing.T) {
	t.Parallel()
	mb := strings.Repeat("x", 1<<20)
	tools := func(n int, mutate func([]*registryv1.ToolIdentity)) *registryv1.RecordSnapshotRequest {
		ts := make([]*registryv1.ToolIdentity, n)
		for i := range ts {
			ts[i] = &registryv1.ToolIdentity{Name: "t", Description: "d"}
		}
		if mutate != nil {
			mutate(ts)
		}
		return &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{ConnectionId: "c", Tools: ts}}
	}
	bigSchema, err := structpb.NewStruct(map[string]any{"description": strings.Repeat("s", 2<<20)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		in     proto.Message
		reason string
		field  string
		limit  string
	}{
		{"within every limit", tools(5, nil), "", "", ""},
		{"a 1 MB id", &registryv1.GetConnectionRequest{Id: mb}, bounds.ReasonFieldTooLong, "id", "256"},
		{"a nested description over its own limit", tools(4, func(ts []*registryv1.ToolIdentity) { ts[3].Description = strings.Repeat("d", bounds.Long+1) }),
			bounds.ReasonFieldTooLong, "snapshot.tools[3].description", "65536"},
		{"a nested digest, an identifier by its name", tools(1, func(ts []*registryv1.ToolIdentity) { ts[0].InputSchemaDigest = mb }),
			bounds.ReasonFieldTooLong, "snapshot.tools[0].input_schema_digest", "256"},
		{"free text by the default", &registryv1.RetireConnectionRequest{Id: "c", Reason: strings.Repeat("r", bounds.Text+1)},
			bounds.ReasonFieldTooLong, "reason", "4096"},
		{"too many list entries", tools(6, nil), bounds.ReasonTooManyEntries, "snapshot.tools", "5"},
		{"a list element", &policyv1.EligibleRequest{TaskId: "t", Requester: &policyv1.Principal{Id: "p", Groups: []string{"a", "b", mb}}},
			bounds.ReasonFieldTooLong, "requester.groups[2]", "256"},
		{"a scope over the default entries", &policyv1.RegisterTaskRequest{TaskId: "t", SourceScope: make([]string, bounds.Entries+1)},
			bounds.ReasonScopeTooLarge, "source_scope", "1000"},
		{"a structured value by its size", &registryv1.CreateCapabilityRequest{Capability: &registryv1.Capability{Name: "c", InputSchema: bigSchema}},
			bounds.ReasonFieldTooLong, "capability.input_schema", "1048576"},
		{"a map key", &evidencev1.RecordObservationRequest{Observation: &evidencev1.SourceObservation{RevisionMetadata: map[string]string{mb: "v"}}},
			bounds.ReasonFieldTooLong, "observation.revision_metadata key", "256"},
		{"a map value", &evidencev1.RecordObservationRequest{Observation: &evidencev1.SourceObservation{RevisionMetadata: map[string]string{"etag": mb}}},
			bounds.ReasonFieldTooLong, `observation.revision_metadata["etag"]`, "4096"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := testLimits.Check(tc.in)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !apierror.Is(err, codes.InvalidArgument, tc.reason) {
				t.Fatalf("got %v, want INVALID_ARGUMENT %s", err, tc.reason)
			}
			md := apierror.Info(err).GetMetadata()
			if md["field"] != tc.field || md["limit"] != tc.limit {
				t.Errorf("metadata %v, want field %q limit %s", md, tc.field, tc.limit)
			}
			if f := apierror.Fields(err); len(f) != 1 || f[0] != tc.field {
				t.Errorf("field violations %v, want %q", f, tc.field)
			}
			if msg := status.Convert(err).Message(); len(msg) > 200 || strings.Contains(msg, "xxxx") {
				t.Errorf("message echoes the value (%d bytes): %.100q", len(msg), msg)
			}
		})
	}
}

// bounded is a service implementation that declares limits.
type bounded struct{}

func (bounded) Limits() bounds.Limits { return testLimits }

func TestUnaryServer(t *testing.T) {
	t.Parallel()
	icpt := bounds.UnaryServer()
	over := &registryv1.GetConnectionRequest{Id: strings.Repeat("i", bounds.ID+1)}
	for _, tc := range []struct {
		name    string
		server  any
		req     any
		handled bool
	}{
		{"over a declared limit", bounded{}, over, false},
		{"within the limits", bounded{}, &registryv1.GetConnectionRequest{Id: "c"}, true},
		{"a service that bounds its own requests", struct{}{}, over, true},
	} {
		handled := false
		_, err := icpt(context.Background(), tc.req, &grpc.UnaryServerInfo{Server: tc.server, FullMethod: "/x/Y"},
			func(context.Context, any) (any, error) { handled = true; return nil, nil })
		if handled != tc.handled || (err != nil) == tc.handled {
			t.Errorf("%s: handled %v, err %v; want handled %v", tc.name, handled, err, tc.handled)
		}
	}
}

func TestNames(t *testing.T) {
	t.Parallel()
	names := make([]string, 13)
	for i := range names {
		names[i] = strings.Repeat("n", 1000)
	}
	shown, more := bounds.Names(names)
	if len(shown) != bounds.EchoedNames || more != 3 || len(shown[0]) != bounds.Echo {
		t.Errorf("shown %d names of %d bytes, %d more; want %d of %d, 3 more", len(shown), len(shown[0]), more, bounds.EchoedNames, bounds.Echo)
	}
}

// BenchmarkLimitsCheck bounds a request within its limits, the shape of a
// discovery snapshot (nested messages, lists, maps): the cost every RPC
// pays in UnaryServer.
func BenchmarkLimitsCheck(b *testing.B) {
	tools := make([]*registryv1.ToolIdentity, 5)
	for i := range tools {
		tools[i] = &registryv1.ToolIdentity{Name: "search", Description: "Search the sources.", InputSchemaDigest: "sha256:0"}
	}
	req := &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{
		ConnectionId: "conn_1", Tools: tools,
	}}
	for b.Loop() {
		if err := testLimits.Check(req); err != nil {
			b.Fatal(err)
		}
	}
}
