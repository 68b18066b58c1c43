package resultschema_test

import (
	"encoding/json"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/resultschema"
)

func mustStruct(t *testing.T, js string) *structpb.Struct {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(js), &m); err != nil {
		t.Fatal(err)
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCompile(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, schema string
		ok           bool
	}{
		{"2020-12 by default", `{"type":"object","properties":{"content":{"type":"string"}},"required":["content"]}`, true},
		{"draft-07 as zod declares it", `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"a":{"type":"number"}}}`, true},
		{"local references", `{"type":"object","properties":{"e":{"$ref":"#/$defs/e"}},"$defs":{"e":{"type":"string"}}}`, true},
		{"a remote reference", `{"type":"object","properties":{"e":{"$ref":"https://example.com/e.json"}}}`, false},
		{"an unknown draft", `{"$schema":"http://json-schema.org/draft-04/schema#","type":"object"}`, false},
		{"a reference to nothing", `{"type":"object","properties":{"e":{"$ref":"#/$defs/missing"}}}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := resultschema.Compile(mustStruct(t, c.schema))
			if (err == nil) != c.ok {
				t.Errorf("Compile = %v, want ok %t", err, c.ok)
			}
		})
	}
	if _, err := resultschema.Compile(nil); err == nil {
		t.Error("Compile(nil) succeeded")
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	s, err := resultschema.Compile(mustStruct(t, `{
		"type": "object",
		"properties": {
			"entities": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
			"count": {"type": "integer"}
		},
		"required": ["entities"],
		"additionalProperties": false
	}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, content string
		ok            bool
	}{
		{"valid", `{"entities":[{"name":"alice"}],"count":1}`, true},
		{"missing required", `{"count":1}`, false},
		{"wrong type deep inside", `{"entities":[{"name":7}]}`, false},
		{"an unknown member", `{"entities":[],"extra":true}`, false},
		{"a number where an integer is due", `{"entities":[],"count":1.5}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			err := s.Validate(mustStruct(t, c.content).AsMap())
			if (err == nil) != c.ok {
				t.Errorf("Validate = %v, want ok %t", err, c.ok)
			}
		})
	}
}
