package argmap

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func schemaOf(t *testing.T, doc string) Node {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(doc), &v); err != nil {
		t.Fatal(err)
	}
	n, err := NewSchema(v).Root()
	if err != nil {
		t.Fatalf("Root: %v", err)
	}
	return n
}

// at walks a node along a pointer, failing the test where it cannot.
func at(t *testing.T, n Node, ptr string) Node {
	t.Helper()
	p := MustParse(ptr)
	for i, tok := range p {
		if p.Element(i) {
			idx, _ := Index(tok)
			el, ok, err := n.Element(idx)
			if err != nil || !ok {
				t.Fatalf("%s: element %s: array %v, %v", ptr, tok, ok, err)
			}
			n = el
			continue
		}
		child, st, err := n.Field(tok)
		if err != nil || st != FieldDeclared {
			t.Fatalf("%s: field %s: status %d, %v", ptr, tok, st, err)
		}
		n = child
	}
	return n
}

func TestTypes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		schema string
		want   Types
		name   string
	}{
		{`{"type":"string"}`, TypeString, "string"},
		{`{"type":"number"}`, TypeNumber, "number"},
		{`{"type":"integer"}`, TypeInteger, "integer"},
		{`{"type":["string","null"]}`, TypeString | TypeNull, "string or null"},
		{`{"anyOf":[{"type":"string"},{"type":"array","items":{"type":"string"}}]}`, TypeString | TypeArray, "array or string"},
		{`{"allOf":[{"type":["string","integer"]},{"type":["integer","boolean"]}]}`, TypeInteger, "integer"},
		{`{"type":"number","allOf":[{"type":"integer"}]}`, TypeInteger, "integer"},
		{`{"enum":["a","b"]}`, TypeString, "string"},
		{`{"const":2}`, TypeInteger, "integer"},
		{`{}`, AnyType, "any type"},
		{`true`, AnyType, "any type"},
		{`false`, 0, "nothing"},
	}
	for _, tt := range tests {
		n := schemaOf(t, tt.schema)
		if got := n.Types(); got != tt.want || got.String() != tt.name {
			t.Errorf("Types(%s) = %v (%s), want %v (%s)", tt.schema, uint8(got), got, uint8(tt.want), tt.name)
		}
	}
	if !TypeNumber.Has(TypeInteger) || TypeInteger.Has(TypeNumber) || TypeString.Has(0) {
		t.Error("an integer must fit a number, and a number must not fit an integer")
	}
}

// A remote schema in the shape tools publish: draft-07 with definitions,
// 2020-12 with $defs, references through properties, nullable anyOf.
const remoteSchema = `{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "type": "object",
  "properties": {
    "paths": {"type": "array", "items": {"type": "string", "maxLength": 64}, "minItems": 1, "maxItems": 3},
    "options": {"$ref": "#/definitions/Options"},
    "again": {"$ref": "#/properties/options"},
    "cursor": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    "tuple": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}], "additionalItems": false},
    "labels": {"type": "object", "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": false},
    "extra": {"type": "object", "additionalProperties": {"type": "integer"}}
  },
  "required": ["paths"],
  "additionalProperties": false,
  "definitions": {
    "Options": {"type": "object", "properties": {"depth": {"type": "integer", "maximum": 5}, "mode": {"enum": ["fast", "full"]}}, "required": ["mode"]}
  }
}`

func TestWalk(t *testing.T) {
	t.Parallel()
	root := schemaOf(t, remoteSchema)
	tests := []struct {
		ptr  string
		want Types
	}{
		{"/paths", TypeArray},
		{"/paths/0", TypeString},
		{"/paths/7", TypeString},
		{"/options", TypeObject},
		{"/options/depth", TypeInteger},
		{"/again/depth", TypeInteger},
		{"/cursor", TypeString | TypeNull},
		{"/tuple/0", TypeString},
		{"/tuple/1", TypeInteger},
		{"/labels/x-team", TypeString},
		{"/extra/anything", TypeInteger},
	}
	for _, tt := range tests {
		if got := at(t, root, tt.ptr).Types(); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.ptr, got, tt.want)
		}
	}
	if req := root.Required(); len(req) != 1 || !slices.Equal(req[0], []string{"paths"}) {
		t.Errorf("required = %v", req)
	}
	if req := at(t, root, "/options").Required(); len(req) != 1 || !slices.Equal(req[0], []string{"mode"}) {
		t.Errorf("options required = %v", req)
	}
	if b := at(t, root, "/paths").ItemBounds(); len(b) != 1 || b[0] != (Bounds{Min: 1, Max: 3}) {
		t.Errorf("paths bounds = %v", b)
	}
	if !at(t, root, "/options/mode").Closed(TypeString) || at(t, root, "/paths/0").Closed(TypeString) {
		t.Error("an enum is closed, a plain string is not")
	}
	if v, ok := at(t, root, "/options/mode").Values(); !ok || len(v) != 2 {
		t.Errorf("mode values = %v, %v", v, ok)
	}
	if got := root.FieldNames(); !slices.Equal(got, []string{"again", "cursor", "extra", "labels", "options", "paths", "tuple"}) {
		t.Errorf("field names = %v", got)
	}

	// What is not declared, and what is not an object or an array.
	for _, tt := range []struct {
		parent, field string
		want          FieldStatus
	}{
		{"", "nope", FieldUndeclared},
		{"/labels", "team", FieldUndeclared},
		{"/options", "other", FieldUndeclared}, // no additionalProperties: still undeclared
		{"/paths", "x", FieldNotObject},
		{"/options/depth", "x", FieldNotObject},
	} {
		parent := root
		if tt.parent != "" {
			parent = at(t, root, tt.parent)
		}
		if _, st, err := parent.Field(tt.field); err != nil || st != tt.want {
			t.Errorf("%s/%s: status %d, %v; want %d", tt.parent, tt.field, st, err, tt.want)
		}
	}
	if el, _, err := at(t, root, "/tuple").Element(2); err != nil || !el.Impossible() {
		t.Errorf("tuple element 2 = %v, %v; additionalItems false admits nothing", el, err)
	}
	if _, isArray, _ := at(t, root, "/options").Element(0); isArray {
		t.Error("an object has no elements")
	}
}

func TestWalk202012(t *testing.T) {
	t.Parallel()
	root := schemaOf(t, `{
	  "$schema": "https://json-schema.org/draft/2020-12/schema",
	  "type": "object",
	  "properties": {"pair": {"type": "array", "prefixItems": [{"type": "string"}], "items": {"$ref": "#/$defs/N"}}},
	  "$defs": {"N": {"type": "number"}}
	}`)
	if got := at(t, root, "/pair/0").Types(); got != TypeString {
		t.Errorf("/pair/0 = %s", got)
	}
	if got := at(t, root, "/pair/1").Types(); got != TypeNumber {
		t.Errorf("/pair/1 = %s", got)
	}
}

func TestSchemaRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, schema, want string
	}{
		{"remote reference", `{"$ref":"https://example.com/schema.json"}`, "not local"},
		{"anchor", `{"$ref":"#node"}`, "anchor"},
		{"dangling", `{"$ref":"#/$defs/Missing"}`, "names nothing"},
		{"cycle", `{"$ref":"#/$defs/A","$defs":{"A":{"$ref":"#/$defs/B"},"B":{"$ref":"#/$defs/A"}}}`, "deep"},
		{"explosion", `{"allOf":[` + strings.Repeat(`{"anyOf":[{"type":"string"},{"type":"null"},{"type":"integer"}]},`, 5) + `{}]}`, "alternatives"},
		{"not a schema", `{"allOf":[3]}`, "object or a boolean"},
	}
	for _, tt := range tests {
		var v any
		if err := json.Unmarshal([]byte(tt.schema), &v); err != nil {
			t.Fatal(err)
		}
		_, err := NewSchema(v).Root()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error saying %q", tt.name, err, tt.want)
		}
	}
	// A recursive schema is fine: references are followed only when a
	// place is looked at.
	root := schemaOf(t, `{"$ref":"#/$defs/Node","$defs":{"Node":{"type":"object","properties":{"children":{"type":"array","items":{"$ref":"#/$defs/Node"}},"name":{"type":"string"}}}}}`)
	if got := at(t, root, "/children/0/children/3/name").Types(); got != TypeString {
		t.Errorf("recursive walk = %s", got)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	root := schemaOf(t, remoteSchema)
	tests := []struct {
		ptr     string
		value   any
		wantErr string
	}{
		{"/options/depth", 3.0, ""},
		{"/options/depth", 7.0, "maximum"},
		{"/options/depth", "3", "type"},
		{"/options/mode", "fast", ""},
		{"/options/mode", "slow", "enum"},
		{"/options", map[string]any{"mode": "full", "depth": 1.0}, ""},
		{"/options", map[string]any{"depth": 1.0}, "required"},
		{"/again", map[string]any{"mode": "fast"}, ""}, // through a reference to a property
		{"/paths/0", strings.Repeat("x", 65), "maxLength"},
		{"/paths", []any{"a", "b"}, ""},
		{"/paths", []any{}, "minItems"},
		{"/cursor", nil, ""},
		{"/cursor", 1.0, "anyOf"},
	}
	for _, tt := range tests {
		err := at(t, root, tt.ptr).Validate(tt.value)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("Validate(%s, %v) = %v", tt.ptr, tt.value, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("Validate(%s, %v) = %v, want an error saying %q", tt.ptr, tt.value, err, tt.wantErr)
		}
		if err != nil && strings.Contains(err.Error(), documentKey) {
			t.Errorf("the error names the wrapper: %v", err)
		}
	}
	if err := schemaOf(t, `false`).Validate("x"); err == nil {
		t.Error("a false schema accepted a value")
	}
}
