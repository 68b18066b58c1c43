package orchestrator

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/v0m3/v0m3/internal/summary"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// summarize is the review surface of a request: the consequence in product
// terms, built from the capability's declared summary template and the
// normalized product arguments, e.g. "Render preview of document revision
// 31 using profile 4". It is the only place that phrases one: approvals,
// events and traces show this text, never a remote method and a JSON
// payload. Handle fields show the label the model saw, never the handle or
// its server-side target.
//
// A "{field}" placeholder in the template (syntax: package summary) takes
// the field's value: a handle's label or a string quoted (so a value can
// never pass for the template's own words), anything else as written. A
// template naming a field the request lacks, one that does not parse, or
// a capability without one reads as the capability's name in words and
// its product fields.
func summarize(capability *registryv1.Capability, normalized map[string]any, handleLabels map[string]string) string {
	value := func(field string) string {
		if l, ok := handleLabels[field]; ok {
			return fmt.Sprintf("%q", l)
		}
		return fmt.Sprint(normalized[field])
	}
	if t := capability.GetSummaryTemplate(); t != "" {
		if s, ok := summary.Render(t, func(field string) (string, bool) {
			v, ok := normalized[field]
			if !ok {
				return "", false
			}
			if s, isString := v.(string); isString {
				if _, isHandle := handleLabels[field]; !isHandle {
					return fmt.Sprintf("%q", s), true
				}
			}
			return value(field), true
		}); ok {
			return s
		}
	}
	// A capability without a usable template still reads as a product
	// action: its name in words and its product fields, sorted.
	var parts []string
	for _, f := range slices.Sorted(maps.Keys(normalized)) {
		parts = append(parts, strings.ReplaceAll(f, "_", " ")+" "+value(f))
	}
	name := capability.GetName()
	if name == "" {
		name = "unnamed capability"
	}
	head := strings.ToUpper(name[:1]) + strings.ReplaceAll(name[1:], "_", " ")
	if len(parts) == 0 {
		return head
	}
	return head + " with " + strings.Join(parts, ", ")
}
