package registry

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/provenance"
	"github.com/v0m3/v0m3/internal/resultschema"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// reviewResults checks what a proposal says about its tool's results and
// records it on the mapping under review: the declared provenance, and the
// tool's output schema as the snapshot observed it (the schema every
// result is validated against, see Mapping.output_schema). tool is nil for
// a resource. It returns the violations of a provenance that cannot hold
// or an output schema no result could be validated with.
func reviewResults(m *registryv1.Mapping, req *registryv1.ProposeMappingRequest, cp *registryv1.Capability, tool *registryv1.ToolIdentity) []apierror.FieldViolation {
	var v []apierror.FieldViolation
	add := func(field, desc string) { v = append(v, apierror.FieldViolation{Field: field, Description: desc}) }
	if tool.GetOutputSchema() != nil {
		if _, err := resultschema.Compile(tool.GetOutputSchema()); err != nil {
			add("target.name", fmt.Sprintf("tool %q declares an output schema its results cannot be validated with (%v); the server must declare a self-contained JSON Schema", tool.GetName(), err))
		}
		m.OutputSchema = proto.CloneOf(tool.GetOutputSchema())
		m.OutputSchemaDigest = tool.GetOutputSchemaDigest()
	}
	p := req.GetProvenance()
	if p == nil {
		return v
	}
	m.Provenance = proto.CloneOf(p)
	mode := provenance.Mode(p)
	if mode == registryv1.ProvenanceMode_PROVENANCE_MODE_CONTENT_URI {
		if p.GetHandleField() != "" || p.GetUriPointer() != "" {
			add("provenance", "content URI provenance takes neither handle_field nor uri_pointer")
		}
		return v
	}
	// Attribution beyond the content's own URIs applies to a tool whose
	// results are sources.
	switch {
	case mode != registryv1.ProvenanceMode_PROVENANCE_MODE_HANDLE_TARGET && mode != registryv1.ProvenanceMode_PROVENANCE_MODE_STRUCTURED_URI:
		add("provenance.mode", fmt.Sprintf("unknown provenance mode %d", mode))
		return v
	case tool == nil:
		add("provenance.mode", "a resource read is attributed to the URI it reads; only a tool's result takes another provenance")
		return v
	case provenance.ResultKind(cp) != registryv1.ResultKind_RESULT_KIND_SOURCE_OBSERVATION:
		add("provenance.mode", fmt.Sprintf("capability %s's results are %s, not source observations; provenance applies to sources",
			cp.GetName(), strings.ToLower(strings.TrimPrefix(provenance.ResultKind(cp).String(), "RESULT_KIND_"))))
		return v
	}
	switch mode {
	case registryv1.ProvenanceMode_PROVENANCE_MODE_HANDLE_TARGET:
		if p.GetUriPointer() != "" {
			add("provenance.uri_pointer", "handle target provenance takes no uri_pointer")
		}
		field := p.GetHandleField()
		switch {
		case field == "":
			add("provenance.handle_field", "the handle field whose target the result is attributed to is required")
		case !isHandleField(cp, field):
			add("provenance.handle_field", fmt.Sprintf("product field %q is not a handle field of capability %s (handle fields: %s)",
				field, cp.GetName(), orNone(handleFieldNames(cp))))
		case !boundFromHandle(req.GetArgumentMap(), field):
			// A result attributed to a target the call was not about
			// would be a false source.
			add("provenance.handle_field", fmt.Sprintf("handle field %q is not bound (from_handle) in the argument map, so the call is not about its target", field))
		}
	case registryv1.ProvenanceMode_PROVENANCE_MODE_STRUCTURED_URI:
		if p.GetHandleField() != "" {
			add("provenance.handle_field", "structured URI provenance takes no handle_field")
		}
		ptr := p.GetUriPointer()
		if _, err := provenance.ParsePointer(ptr); err != nil {
			add("provenance.uri_pointer", err.Error())
			break
		}
		if schema := tool.GetOutputSchema(); schema != nil {
			if err := provenance.CheckPointerInSchema(schema.AsMap(), ptr); err != nil {
				add("provenance.uri_pointer", fmt.Sprintf("%v (tool %q)", err, tool.GetName()))
			}
		}
	}
	return v
}

func isHandleField(cp *registryv1.Capability, field string) bool {
	for _, h := range cp.GetHandles() {
		if h.GetField() == field {
			return true
		}
	}
	return false
}

// boundFromHandle reports whether the argument map passes field's handle
// target to the remote.
func boundFromHandle(bindings []*registryv1.ArgumentBinding, field string) bool {
	for _, b := range bindings {
		if b.GetFromHandle() && b.GetProductField() == field {
			return true
		}
	}
	return false
}

func orNone(list []string) string {
	if len(list) == 0 {
		return "none"
	}
	return strings.Join(list, ", ")
}
