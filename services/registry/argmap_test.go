package registry_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// filesSchema is a remote input schema in the shape tools publish
// (draft-07, definitions behind a $ref, an array of strings, an enum).
const filesSchema = `{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "type": "object",
  "properties": {
    "paths": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    "options": {"$ref": "#/definitions/Options"},
    "label": {"type": "string"},
    "count": {"type": "number"},
    "rank": {"type": "integer"},
    "mode": {"enum": ["fast", "full"]},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    "legacy": false,
    "request_id": {"type": "string"}
  },
  "required": ["paths"],
  "additionalProperties": false,
  "definitions": {
    "Options": {
      "type": "object",
      "properties": {"depth": {"type": "integer", "minimum": 0}, "query": {"type": "string"}, "follow": {"type": "boolean"}},
      "required": ["depth"]
    }
  }
}`

func filesTool(t *testing.T) *registryv1.ToolIdentity {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(filesSchema), &m); err != nil {
		t.Fatal(err)
	}
	return &registryv1.ToolIdentity{Name: "read_files", Description: "Read files.", InputSchema: mustStruct(t, m)}
}

func value(t *testing.T, v any) *structpb.Value {
	t.Helper()
	out, err := structpb.NewValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Binding shorthands.
func bindField(remote, product string) *registryv1.ArgumentBinding {
	return &registryv1.ArgumentBinding{RemoteField: remote, ProductField: product}
}

func bindHandle(remote string) *registryv1.ArgumentBinding {
	return &registryv1.ArgumentBinding{RemoteField: remote, ProductField: "source", FromHandle: true}
}

func bindConst(t *testing.T, remote string, v any) *registryv1.ArgumentBinding {
	return &registryv1.ArgumentBinding{RemoteField: remote, Constant: value(t, v)}
}

type argMapCase struct {
	name       string
	capability string // default retrieve_authorized_source (source: handle, query: string)
	bindings   []*registryv1.ArgumentBinding
	defaults   map[string]any
	idemField  string
	// For a refusal: the field violation and words its description says.
	field, says string
}

func filesProposal(t *testing.T, snap *registryv1.DiscoverySnapshot, tc argMapCase) *registryv1.ProposeMappingRequest {
	req := &registryv1.ProposeMappingRequest{
		Capability: "retrieve_authorized_source", ConnectionId: snap.GetConnectionId(), SnapshotId: snap.GetId(),
		Target:              &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "read_files"},
		ArgumentMap:         tc.bindings,
		Limits:              &registryv1.Limits{MaxResponseBytes: 1 << 16, MaxItems: 4},
		IdempotencyKeyField: tc.idemField,
	}
	if tc.capability != "" {
		req.Capability = tc.capability
	}
	if tc.defaults != nil {
		req.Defaults = mustStruct(t, tc.defaults)
	}
	return req
}

// TestArgumentMapAccepted: the shapes a typed argument map can take pass
// review and are stored as proposed.
func TestArgumentMapAccepted(t *testing.T) {
	t.Parallel()
	r := start(t)
	snap := record(t, r.client, createHTTP(t, r.client), filesTool(t))
	tests := []argMapCase{
		{name: "a handle as the first element of an array",
			bindings: []*registryv1.ArgumentBinding{bindHandle("/paths/0")}},
		{name: "a handle appended, a flat name beside it",
			bindings: []*registryv1.ArgumentBinding{bindHandle("/paths/-"), bindField("label", "query")}},
		{name: "a nested object field behind a $ref, and a constant beside it",
			bindings: []*registryv1.ArgumentBinding{bindHandle("/paths/0"), bindField("/options/query", "query"), bindConst(t, "/options/depth", 2)}},
		{name: "constants of several types, appended after a handle",
			bindings: []*registryv1.ArgumentBinding{
				bindHandle("/paths/-"), bindConst(t, "/paths/-", "notes.md"), bindConst(t, "mode", "fast"),
				bindConst(t, "options", map[string]any{"depth": 1, "follow": true}), bindConst(t, "/tags/0", "faq"),
			}},
		{name: "defaults deep-merge around a nested binding",
			bindings: []*registryv1.ArgumentBinding{bindHandle("/paths/0"), bindField("/options/query", "query")},
			defaults: map[string]any{"options": map[string]any{"depth": 1}, "mode": "full"}},
		{name: "a required array from the defaults",
			bindings: []*registryv1.ArgumentBinding{bindField("label", "query")},
			defaults: map[string]any{"paths": []any{"README.md"}}},
		{name: "an integer product field into a number and an integer", capability: "render_preview",
			bindings: []*registryv1.ArgumentBinding{bindField("count", "document_revision"), bindField("/options/depth", "profile"), bindConst(t, "paths", []any{"doc.md"})}},
		{name: "an idempotency key field",
			bindings: []*registryv1.ArgumentBinding{bindHandle("/paths/0")}, idemField: "request_id"},
		{name: "product fields named by pointer",
			bindings: []*registryv1.ArgumentBinding{{RemoteField: "/paths/0", ProductField: "/source", FromHandle: true}, bindField("/label", "/query")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := filesProposal(t, snap, tc)
			m, err := r.client.ProposeMapping(t.Context(), req)
			if err != nil {
				t.Fatalf("ProposeMapping: %v", err)
			}
			if len(m.GetArgumentMap()) != len(tc.bindings) {
				t.Fatalf("stored %d bindings, proposed %d", len(m.GetArgumentMap()), len(tc.bindings))
			}
			for i, b := range m.GetArgumentMap() {
				if !proto.Equal(b, tc.bindings[i]) {
					t.Errorf("binding %d stored as %v, proposed %v", i, b, tc.bindings[i])
				}
			}
		})
	}
}

// TestArgumentMapRefused: each way a map cannot fit is refused at review
// with INVALID_ARGUMENT, reason INVALID_MAPPING and a field violation
// saying what and where; nothing is stored.
func TestArgumentMapRefused(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn := createHTTP(t, r.client)
	snap := record(t, r.client, conn, filesTool(t))
	handle0 := bindHandle("/paths/0")
	tests := []argMapCase{
		// Types that cannot fit.
		{name: "a string into an array", bindings: []*registryv1.ArgumentBinding{bindHandle("paths")},
			field: "argument_map[0].remote_field", says: `product field "source" (a handle, sent as its resolved target: a string) cannot fit remote "paths" (array); bind it to /paths/- to send a one-element array`},
		{name: "an integer into a string", capability: "render_preview",
			bindings: []*registryv1.ArgumentBinding{bindField("label", "document_revision"), bindConst(t, "paths", []any{"a"})},
			field:    "argument_map[0].remote_field", says: `product field "document_revision" (integer) cannot fit remote "label" (string)`},
		{name: "a free string into an enum", bindings: []*registryv1.ArgumentBinding{handle0, bindField("mode", "query")},
			field: "argument_map[1].remote_field", says: "accepts only listed values"},
		{name: "anything where the remote schema is false", bindings: []*registryv1.ArgumentBinding{handle0, bindField("legacy", "query")},
			field: "argument_map[1].remote_field", says: "forbids any value"},
		{name: "a value inside a string", bindings: []*registryv1.ArgumentBinding{handle0, bindField("/label/text", "query")},
			field: "argument_map[1].remote_field", says: `remote "label" is string, not an object`},
		// Paths the remote does not declare.
		{name: "an unknown top-level field", bindings: []*registryv1.ArgumentBinding{handle0, bindField("q", "query")},
			field: "argument_map[1].remote_field", says: `remote field "q" is not in the input schema of tool "read_files" (fields: count, label, legacy, mode, options, paths, rank, request_id, tags)`},
		{name: "an unknown nested field", bindings: []*registryv1.ArgumentBinding{handle0, bindConst(t, "/options/depth", 1), bindField("/options/text", "query")},
			field: "argument_map[2].remote_field", says: "remote field /options/text is not in the input schema of tool \"read_files\" (fields at \"options\": depth, follow, query)"},
		{name: "an element of an object", bindings: []*registryv1.ArgumentBinding{handle0, bindField("/options/0", "query")},
			field: "argument_map[1].remote_field", says: `remote "options" is object, not an array`},
		// Required remote fields bound by nothing.
		{name: "a missing required top-level field", bindings: []*registryv1.ArgumentBinding{bindField("label", "query")},
			field: "argument_map", says: `missing required remote field "paths" of tool "read_files"`},
		{name: "a missing required field of an object bound into", bindings: []*registryv1.ArgumentBinding{handle0, bindField("/options/query", "query")},
			field: "argument_map", says: "missing required remote field /options/depth"},
		// Paths bound twice, or inside each other.
		{name: "a path bound twice", bindings: []*registryv1.ArgumentBinding{handle0, bindConst(t, "/paths/0", "x")},
			field: "argument_map[1].remote_field", says: "bound twice (also by argument_map[0])"},
		{name: "a path inside a value bound whole", bindings: []*registryv1.ArgumentBinding{handle0, bindConst(t, "options", map[string]any{"depth": 1}), bindField("/options/query", "query")},
			field: "argument_map[2].remote_field", says: "lies inside \"options\", which argument_map[1] binds whole"},
		{name: "a whole value over a path bound inside it", bindings: []*registryv1.ArgumentBinding{handle0, bindField("/options/query", "query"), bindConst(t, "options", map[string]any{"depth": 1})},
			field: "argument_map[2].remote_field", says: "would replace what argument_map[1] binds inside it"},
		{name: "a gap in an array", bindings: []*registryv1.ArgumentBinding{bindHandle("/paths/1")},
			field: "argument_map[0].remote_field", says: "gap"},
		{name: "more items than the remote accepts", bindings: []*registryv1.ArgumentBinding{handle0, bindConst(t, "/tags/-", "a"), bindConst(t, "/tags/-", "b"), bindField("/tags/-", "query")},
			field: "argument_map[1].remote_field", says: "accepts at most 2 items; the map can send 3"},
		// Constants the remote forbids.
		{name: "a constant of the wrong type", bindings: []*registryv1.ArgumentBinding{handle0, bindConst(t, "/options/depth", "deep")},
			field: "argument_map[1].constant", says: "cannot fit remote /options/depth"},
		{name: "a constant out of range", bindings: []*registryv1.ArgumentBinding{handle0, bindConst(t, "/options/depth", -1)},
			field: "argument_map[1].constant", says: "minimum"},
		{name: "a constant not in the enum", bindings: []*registryv1.ArgumentBinding{handle0, bindConst(t, "mode", "slow")},
			field: "argument_map[1].constant", says: "enum"},
		{name: "a constant object with an undeclared field", bindings: []*registryv1.ArgumentBinding{handle0, bindConst(t, "options", map[string]any{"depth": 1, "color": "red"})},
			field: "argument_map[1].constant", says: "sets remote field /options/color, which the input schema"},
		{name: "a constant that looks like a secret", bindings: []*registryv1.ArgumentBinding{handle0, bindConst(t, "label", "ghp_"+strings.Repeat("a", 36))},
			field: "argument_map[1].constant", says: "looks like a secret"},
		// Binding shapes.
		{name: "both a product field and a constant", bindings: []*registryv1.ArgumentBinding{handle0, {RemoteField: "label", ProductField: "query", Constant: value(t, "x")}},
			field: "argument_map[1].constant", says: "either product_field or constant"},
		{name: "neither a product field nor a constant", bindings: []*registryv1.ArgumentBinding{handle0, {RemoteField: "label"}},
			field: "argument_map[1].product_field", says: "or a constant, is required"},
		{name: "a constant marked as a handle", bindings: []*registryv1.ArgumentBinding{handle0, {RemoteField: "label", Constant: value(t, "x"), FromHandle: true}},
			field: "argument_map[1].from_handle", says: "not a handle"},
		{name: "an append in the middle of a path", bindings: []*registryv1.ArgumentBinding{handle0, bindField("/options/-/query", "query")},
			field: "argument_map[1].remote_field", says: "may only be the last token"},
		{name: "an unknown product path", bindings: []*registryv1.ArgumentBinding{handle0, bindField("label", "/query/text")},
			field: "argument_map[1].product_field", says: `product field /query/text is not in the input schema of capability retrieve_authorized_source (fields: query, source)`},
		// Defaults and the idempotency key field.
		{name: "a default the remote forbids", bindings: []*registryv1.ArgumentBinding{handle0}, defaults: map[string]any{"options": map[string]any{"depth": -1}},
			field: "defaults.options.depth", says: "does not fit the remote schema"},
		{name: "a default of an undeclared nested field", bindings: []*registryv1.ArgumentBinding{handle0}, defaults: map[string]any{"options": map[string]any{"depth": 1, "color": "red"}},
			field: "defaults.options.color", says: "not in the input schema"},
		{name: "a default every call overrides", bindings: []*registryv1.ArgumentBinding{handle0, bindField("label", "query")}, defaults: map[string]any{"label": "all"},
			field: "defaults.label", says: "never sent: argument_map[1] binds it in every call"},
		{name: "a default that looks like a secret", bindings: []*registryv1.ArgumentBinding{handle0}, defaults: map[string]any{"label": "Bearer abcdefghijklmnop"},
			field: "defaults.label", says: "looks like a secret"},
		{name: "an idempotency key field that is not a string", bindings: []*registryv1.ArgumentBinding{handle0}, idemField: "rank",
			field: "idempotency_key_field", says: "receives the intent id, a string"},
		{name: "an idempotency key field also bound", bindings: []*registryv1.ArgumentBinding{handle0, bindField("request_id", "query")}, idemField: "request_id",
			field: "idempotency_key_field", says: "cannot also be mapped or defaulted"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := r.client.ProposeMapping(t.Context(), filesProposal(t, snap, tc))
			wantErr(t, err, codes.InvalidArgument, "INVALID_MAPPING")
			if !hasViolation(err, tc.field, tc.says) {
				t.Errorf("violations = %v, want %s saying %q", violations(err), tc.field, tc.says)
			}
		})
	}
	// Cleanups run once every parallel refusal above has finished.
	t.Cleanup(func() {
		list, err := r.client.ListMappings(context.Background(), &registryv1.ListMappingsRequest{ConnectionId: conn.GetId()})
		if err != nil || len(list.GetMappings()) != 0 {
			t.Errorf("mappings after refused proposals = %v, %v; want none", list, err)
		}
	})
}

// TestArgumentMapRemoteSchemaUnreadable: a remote schema that refers
// outside itself cannot be checked, so nothing can be bound to it.
func TestArgumentMapRemoteSchemaUnreadable(t *testing.T) {
	t.Parallel()
	r := start(t)
	tool := &registryv1.ToolIdentity{Name: "read_files", Description: "Read files.", InputSchema: mustStruct(t, map[string]any{
		"type": "object", "properties": map[string]any{"paths": map[string]any{"$ref": "https://schemas.example.com/paths.json"}},
	})}
	snap := record(t, r.client, createHTTP(t, r.client), tool)
	_, err := r.client.ProposeMapping(t.Context(), filesProposal(t, snap, argMapCase{bindings: []*registryv1.ArgumentBinding{bindHandle("/paths/0")}}))
	wantErr(t, err, codes.InvalidArgument, "INVALID_MAPPING")
	if !hasViolation(err, "argument_map[0].remote_field", "is not local") {
		t.Errorf("violations = %v", violations(err))
	}
}

// TestArgumentMapResource: a resource read takes no arguments; only one
// handle may choose what it reads.
func TestArgumentMapResource(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn := createHTTP(t, r.client)
	snap, err := r.client.RecordSnapshot(t.Context(), &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{
		ConnectionId: conn.GetId(), ConfigRevision: 1,
		Resources: []*registryv1.ResourceIdentity{{Uri: "notes://migration", Description: "Migration notes", MimeType: "text/markdown"}}}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		bindings    []*registryv1.ArgumentBinding
		defaults    map[string]any
		field, says string
	}{
		{"a constant", []*registryv1.ArgumentBinding{{RemoteField: "uri", Constant: value(t, "notes://other")}}, nil, "argument_map[0].constant", "only a handle may choose"},
		{"a value", []*registryv1.ArgumentBinding{bindField("uri", "query")}, nil, "argument_map[0].product_field", `"query" is a value`},
		{"defaults", nil, map[string]any{"uri": "notes://other"}, "defaults", "takes no arguments"},
	}
	for _, tc := range tests {
		req := &registryv1.ProposeMappingRequest{
			Capability: "retrieve_authorized_source", ConnectionId: conn.GetId(), SnapshotId: snap.GetId(),
			Target:      &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_RESOURCE, Name: "notes://migration"},
			ArgumentMap: tc.bindings, Limits: &registryv1.Limits{MaxResponseBytes: 1 << 16, MaxItems: 1},
		}
		if tc.defaults != nil {
			req.Defaults = mustStruct(t, tc.defaults)
		}
		_, err := r.client.ProposeMapping(t.Context(), req)
		wantErr(t, err, codes.InvalidArgument, "INVALID_MAPPING")
		if !hasViolation(err, tc.field, tc.says) {
			t.Errorf("%s: violations = %v, want %s saying %q", tc.name, violations(err), tc.field, tc.says)
		}
	}
}

// fieldViolations returns err's BadRequest violations.
func fieldViolations(err error) []*errdetails.BadRequest_FieldViolation {
	var out []*errdetails.BadRequest_FieldViolation
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			out = append(out, br.GetFieldViolations()...)
		}
	}
	return out
}

func hasViolation(err error, field, says string) bool {
	return slices.ContainsFunc(fieldViolations(err), func(v *errdetails.BadRequest_FieldViolation) bool {
		return v.GetField() == field && strings.Contains(v.GetDescription(), says)
	})
}

func violations(err error) []string {
	var out []string
	for _, v := range fieldViolations(err) {
		out = append(out, v.GetField()+": "+v.GetDescription())
	}
	return out
}
