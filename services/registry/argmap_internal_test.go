package registry

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/apierror"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestArgumentMapDeclaredCapability: what only a declared capability can
// ask for (the built-in four have required scalar fields only): optional
// product fields, numbers with fractions, enumerated values and product
// arrays and objects.
func TestArgumentMapDeclaredCapability(t *testing.T) {
	t.Parallel()
	schema := func(doc string) *structpb.Struct {
		var m map[string]any
		if err := json.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatal(err)
		}
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	cp := &registryv1.Capability{
		Name: "search_tickets",
		InputSchema: schema(`{
		  "type": "object",
		  "properties": {
		    "text": {"type": "string"},
		    "ratio": {"type": "number"},
		    "speed": {"enum": ["fast", "full"]},
		    "color": {"enum": ["red", "blue"]},
		    "tags": {"type": "array", "items": {"type": "string"}},
		    "words": {"type": "array", "items": {"type": "string"}, "minItems": 1},
		    "page": {"type": "integer"},
		    "filter": {"type": "object", "properties": {"owner": {"type": "string"}}, "required": ["owner"]}
		  },
		  "required": ["text", "ratio", "speed", "color", "tags", "words", "filter"]
		}`),
	}
	tool := &registryv1.ToolIdentity{Name: "search", InputSchema: schema(`{
	  "type": "object",
	  "properties": {
	    "q": {"type": "string"},
	    "limit": {"type": "integer"},
	    "weight": {"type": "number"},
	    "mode": {"enum": ["fast", "full", "slow"]},
	    "labels": {"type": "array", "items": {"type": "string"}},
	    "ids": {"type": "array", "items": {"type": "integer"}},
	    "where": {"type": "object", "properties": {"owner": {"type": "string"}, "team": {"type": "string"}}, "required": ["owner"]},
	    "strict": {"type": "object", "properties": {"owner": {"type": "string"}, "team": {"type": "string"}}, "required": ["team"]},
	    "page": {"type": "object", "properties": {"n": {"type": "integer"}, "size": {"type": "integer"}}, "required": ["size"]},
	    "pages": {"type": "array", "items": {"type": "integer"}, "minItems": 1}
	  },
	  "required": ["q"]
	}`)}
	b := func(remote, product string) *registryv1.ArgumentBinding {
		return &registryv1.ArgumentBinding{RemoteField: remote, ProductField: product}
	}
	q := b("q", "text")
	tests := []struct {
		name        string
		bindings    []*registryv1.ArgumentBinding
		field, says string // "" when accepted
	}{
		{"a number into a number", []*registryv1.ArgumentBinding{q, b("weight", "ratio")}, "", ""},
		{"a number into an integer", []*registryv1.ArgumentBinding{q, b("limit", "ratio")},
			"argument_map[1].remote_field", "a number may have a fraction"},
		{"an enum into a wider enum", []*registryv1.ArgumentBinding{q, b("mode", "speed")}, "", ""},
		{"an enum with a value the remote refuses", []*registryv1.ArgumentBinding{q, b("mode", "color")},
			"argument_map[1].remote_field", `may carry red, which remote "mode" refuses`},
		{"an array of strings into an array of strings", []*registryv1.ArgumentBinding{q, b("labels", "tags")}, "", ""},
		{"an array of strings into an array of integers", []*registryv1.ArgumentBinding{q, b("ids", "tags")},
			"argument_map[1].remote_field", "items are string, the remote takes integer"},
		{"an element of a product array that may be empty", []*registryv1.ArgumentBinding{b("q", "/tags/0")},
			"argument_map", `required remote field "q" of tool "search" is bound only by optional product fields`},
		{"an element of a product array that cannot be empty", []*registryv1.ArgumentBinding{b("q", "/words/0")}, "", ""},
		{"an object into an object it fits", []*registryv1.ArgumentBinding{q, b("where", "filter")}, "", ""},
		{"an object lacking a field the remote requires", []*registryv1.ArgumentBinding{q, b("strict", "filter")},
			"argument_map[1].remote_field", `the remote requires field "team"`},
		{"an optional field alone behind a required one", []*registryv1.ArgumentBinding{b("/page/n", "page"), q},
			"argument_map", "missing required remote field /page/size"},
		{"an optional product field as the only element of a required array", []*registryv1.ArgumentBinding{q, b("/pages/0", "page"), b("/pages/1", "page")},
			"argument_map[2].remote_field", "when the optional product fields bound before it are absent"},
		{"an optional product field appended", []*registryv1.ArgumentBinding{q, b("/pages/-", "page")}, "", ""},
	}
	for _, tt := range tests {
		req := &registryv1.ProposeMappingRequest{ArgumentMap: tt.bindings}
		v := append(bindingShapeViolations(tt.bindings), validateArgumentMap(req, cp, tool)...)
		if tt.field == "" {
			if len(v) > 0 {
				t.Errorf("%s: refused: %v", tt.name, v)
			}
			continue
		}
		if !slices.ContainsFunc(v, func(f apierror.FieldViolation) bool {
			return f.Field == tt.field && strings.Contains(f.Description, tt.says)
		}) {
			t.Errorf("%s: violations %v, want %s saying %q", tt.name, v, tt.field, tt.says)
		}
	}

	// A required remote field bound only by an optional product field:
	// a call without it would fail at the remote.
	optionalOnly := &registryv1.ToolIdentity{Name: "page", InputSchema: schema(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`)}
	v := validateArgumentMap(&registryv1.ProposeMappingRequest{ArgumentMap: []*registryv1.ArgumentBinding{b("n", "page")}}, cp, optionalOnly)
	if len(v) != 1 || v[0].Field != "argument_map" || !strings.Contains(v[0].Description, `required remote field "n" of tool "page" is bound only by optional product fields`) {
		t.Errorf("optional-only binding of a required field: %v", v)
	}
	// With a default as fallback it is fine: the binding wins when present.
	v = validateArgumentMap(&registryv1.ProposeMappingRequest{ArgumentMap: []*registryv1.ArgumentBinding{b("n", "page")},
		Defaults: &structpb.Struct{Fields: map[string]*structpb.Value{"n": structpb.NewNumberValue(1)}}}, cp, optionalOnly)
	if len(v) != 0 {
		t.Errorf("optional binding over a default: %v", v)
	}
}
