// Package resultschema validates a tool's structured content against the
// output schema the tool declared in the reviewed snapshot. The registry
// compiles a schema when a mapping is proposed, so one that cannot be used
// is refused at review rather than failing every call; the adapter
// validates each result with it.
package resultschema

import (
	"encoding/json"
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"
	"google.golang.org/protobuf/types/known/structpb"
)

// Schema is a compiled output schema.
type Schema struct {
	resolved *jsonschema.Resolved
}

// Compile compiles an output schema as observed (JSON Schema draft 2020-12
// or draft-07, the drafts MCP servers declare). Only references within the
// schema resolve: a schema that refers elsewhere would make validation
// depend on a fetch, which nothing here does.
func Compile(s *structpb.Struct) (*Schema, error) {
	if s == nil {
		return nil, fmt.Errorf("no output schema")
	}
	b, err := json.Marshal(s.AsMap())
	if err != nil {
		return nil, fmt.Errorf("encode output schema: %w", err)
	}
	var js jsonschema.Schema
	if err := json.Unmarshal(b, &js); err != nil {
		return nil, fmt.Errorf("output schema is not a JSON Schema: %w", err)
	}
	if !supported[js.Schema] {
		return nil, fmt.Errorf("output schema declares $schema %q; supported: draft 2020-12 and draft-07", js.Schema)
	}
	r, err := js.Resolve(nil)
	if err != nil {
		return nil, fmt.Errorf("output schema cannot be resolved: %w", err)
	}
	return &Schema{resolved: r}, nil
}

// supported are the $schema values the validator validates with (none
// declared means 2020-12, MCP's default).
var supported = map[string]bool{
	"": true,
	"https://json-schema.org/draft/2020-12/schema": true,
	"http://json-schema.org/draft-07/schema#":      true,
	"https://json-schema.org/draft-07/schema#":     true,
}

// Validate validates structured content (as encoding/json or structpb
// decode JSON). The error may quote the content: it is remote text.
func (s *Schema) Validate(content map[string]any) error {
	return s.resolved.Validate(content)
}
