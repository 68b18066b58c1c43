package adapter

import (
	"cmp"
	"encoding/json"
	"slices"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"

	"github.com/v0m3/v0m3/internal/digest"
)

// A reviewed mapping may let the adapter accept a form elicitation with
// the requested schema's defaults (ELICITATION_POLICY_ACCEPT_DEFAULTS):
// what is answered is then exactly what the server proposed and a
// reviewer agreed to in advance, never a value the adapter made up.

// maxElicitAnswers bounds how many elicitations of one call are
// accepted; later ones are declined.
const maxElicitAnswers = 4

// maxAnsweredFieldName bounds a field name kept as evidence (remote text).
const maxAnsweredFieldName = 256

// elicitAnswer is a form elicitation the adapter accepted, as evidence.
type elicitAnswer struct {
	at      time.Time
	message string          // remote text, scrubbed and truncated
	fields  []answeredField // sorted by name
}

// answeredField is one field answered: its name and its value's digest.
type answeredField struct{ name, valueDigest string }

// defaultsAnswer is the answer to a form elicitation made only of its
// schema's defaults, and whether there is one: a URL-mode request, a
// schema that does not parse, a required field without a default or a
// form without any default get none (the request is declined). scrub
// rewrites a field name (remote text) before it is kept as evidence.
func defaultsAnswer(p *mcp.ElicitParams, scrub func(string) string) (map[string]any, []answeredField, bool) {
	if p == nil || (p.Mode != "" && p.Mode != "form") {
		return nil, nil, false
	}
	raw, err := json.Marshal(p.RequestedSchema)
	if err != nil {
		return nil, nil, false
	}
	var schema struct {
		Properties map[string]struct {
			Default json.RawMessage `json:"default"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	if json.Unmarshal(raw, &schema) != nil {
		return nil, nil, false
	}
	content := map[string]any{}
	var fields []answeredField
	for name, prop := range schema.Properties {
		if len(prop.Default) == 0 {
			continue
		}
		var v any
		if json.Unmarshal(prop.Default, &v) != nil {
			return nil, nil, false
		}
		d, err := digest.JSON(v)
		if err != nil {
			return nil, nil, false
		}
		content[name] = v
		// Scrubbed before it is cut: a credential the cut splits is
		// still found whole.
		fields = append(fields, answeredField{name: truncate(scrub(name), maxAnsweredFieldName), valueDigest: d})
	}
	for _, name := range schema.Required {
		if _, ok := content[name]; !ok {
			return nil, nil, false
		}
	}
	if len(content) == 0 {
		return nil, nil, false
	}
	slices.SortFunc(fields, func(a, b answeredField) int { return cmp.Compare(a.name, b.name) })
	return content, fields, true
}

// acceptsDefaults reports whether the call's mapping lets the adapter
// answer a form elicitation with its defaults.
func acceptsDefaults(p registryv1.ElicitationPolicy) bool {
	return p == registryv1.ElicitationPolicy_ELICITATION_POLICY_ACCEPT_DEFAULTS
}
