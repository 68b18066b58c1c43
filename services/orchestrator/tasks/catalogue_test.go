package tasks

import (
	"testing"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestToolSchemaListsHandlesPerKind: each handle field of the schema the
// model sees lists exactly the offered handles of its kind, as oneOf of
// const and title; other fields and the declared schema stay as declared.
func TestToolSchemaListsHandlesPerKind(t *testing.T) {
	t.Parallel()
	declared := mustStruct(t, map[string]any{
		"type": "object",
		"properties": map[string]any{
			"artifact":    map[string]any{"type": "string", "minLength": 1},
			"destination": map[string]any{"type": "string", "minLength": 1},
			"note":        map[string]any{"type": "string"},
		},
		"required": []any{"artifact", "destination"},
	})
	pristine := proto.CloneOf(declared)
	var (
		art  = registryv1.HandleKind_HANDLE_KIND_ARTIFACT
		dest = registryv1.HandleKind_HANDLE_KIND_DESTINATION
	)
	fields := []*orchestratorv1.HandleFieldOffer{{Field: "artifact", Kind: art}, {Field: "destination", Kind: dest}}
	tests := []struct {
		name    string
		handles []*orchestratorv1.HandleOffer
		want    map[string][]any // field -> oneOf; absent: no oneOf
	}{
		{"one of each kind", []*orchestratorv1.HandleOffer{
			{Handle: "h_art", Label: "preview r31", Kind: art},
			{Handle: "h_dest1", Label: "docs site", Kind: dest},
			{Handle: "h_dest2", Label: "blog", Kind: dest},
		}, map[string][]any{
			"artifact":    {map[string]any{"const": "h_art", "title": "preview r31"}},
			"destination": {map[string]any{"const": "h_dest1", "title": "docs site"}, map[string]any{"const": "h_dest2", "title": "blog"}},
		}},
		{"no destination handle: the field keeps its declared schema", []*orchestratorv1.HandleOffer{
			{Handle: "h_art", Label: "preview r31", Kind: art},
		}, map[string][]any{
			"artifact": {map[string]any{"const": "h_art", "title": "preview r31"}},
		}},
		{"no handle at all", nil, map[string][]any{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := toolSchema(declared, &orchestratorv1.OfferedCapability{HandleFields: fields, Handles: tc.handles})
			if err != nil {
				t.Fatal(err)
			}
			props := got.AsMap()["properties"].(map[string]any)
			for _, f := range []string{"artifact", "destination", "note"} {
				p := props[f].(map[string]any)
				oneOf, listed := p["oneOf"]
				want, wantListed := tc.want[f]
				if listed != wantListed || (listed && !equalJSON(t, oneOf, want)) {
					t.Errorf("%s: oneOf = %v, want %v", f, oneOf, want)
				}
				if p["type"] != "string" {
					t.Errorf("%s lost its declared type: %v", f, p)
				}
			}
			if !proto.Equal(declared, pristine) {
				t.Error("toolSchema changed the declared schema")
			}
		})
	}
	if _, err := toolSchema(declared, &orchestratorv1.OfferedCapability{HandleFields: []*orchestratorv1.HandleFieldOffer{{Field: "missing", Kind: art}}}); err == nil {
		t.Error("a handle field that is not a property was accepted")
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	va, err := structpb.NewValue(a)
	if err != nil {
		t.Fatal(err)
	}
	vb, err := structpb.NewValue(b)
	if err != nil {
		t.Fatal(err)
	}
	return proto.Equal(va, vb)
}

func TestLastSegmentNeverReturnsTheURI(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"note://library/api-migration.md":  "api-migration.md",
		"note://library/dir/":              "dir",
		"file:///srv/notes/a.txt?rev=2#p3": "a.txt",
		"https://example.com/docs/guide":   "guide",
		"note://":                          "source",
		"plain-name":                       "plain-name",
	}
	for uri, want := range tests {
		if got := LastSegment(uri); got != want {
			t.Errorf("LastSegment(%q) = %q, want %q", uri, got, want)
		}
	}
}

func mustStruct(t testing.TB, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatalf("struct: %v", err)
	}
	return s
}
