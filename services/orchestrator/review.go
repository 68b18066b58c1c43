package orchestrator

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// summarize is the review surface of a request: the consequence in product
// terms, built from the capability and the normalized product arguments,
// e.g. "Render preview of document revision 31 using profile 4". It is
// the only place that phrases one: approvals, events and traces show this
// text, never a remote method and a JSON payload. Handle fields show the
// label the model saw, never the handle or its server-side target.
func summarize(capability *registryv1.Capability, normalized map[string]any, handleLabels map[string]string) string {
	value := func(field string) string {
		if l, ok := handleLabels[field]; ok {
			return fmt.Sprintf("%q", l)
		}
		return fmt.Sprint(normalized[field])
	}
	has := func(fields ...string) bool {
		for _, f := range fields {
			if _, ok := normalized[f]; !ok {
				return false
			}
		}
		return true
	}
	switch capability.GetName() {
	case capRenderPreview:
		if has("document_revision", "profile") {
			return fmt.Sprintf("Render preview of document revision %s using profile %s", value("document_revision"), value("profile"))
		}
		if has("document_revision") {
			return fmt.Sprintf("Render preview of document revision %s", value("document_revision"))
		}
	case capRetrieveAuthorizedSource:
		if has("source", "query") {
			return fmt.Sprintf("Retrieve passages about %q from source %s", normalized["query"], value("source"))
		}
		if has("source") {
			return fmt.Sprintf("Retrieve passages from source %s", value("source"))
		}
	case capDeliverApprovedArtifact:
		if has("artifact", "destination") {
			return fmt.Sprintf("Deliver artifact %s to destination %s", value("artifact"), value("destination"))
		}
	}
	// A capability without its own phrase still reads as a product
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
