package registry

import (
	"encoding/json"
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"google.golang.org/protobuf/types/known/structpb"
)

// Reasons a capability's input schema is refused.
const (
	reasonInvalidSchema = "INVALID_SCHEMA"
	reasonRemoteRef     = "SCHEMA_REMOTE_REF"
	reasonRefCycle      = "SCHEMA_REF_CYCLE"
	// reasonUnsupportedSchemaKeyword: the schema uses a keyword (or a
	// property type) outside the subset internal/productschema
	// defines, which the orchestrator could not enforce.
	reasonUnsupportedSchemaKeyword = "UNSUPPORTED_SCHEMA_KEYWORD"
)

// maxSchemaNodes bounds a schema once its references are resolved: a few
// definitions that refer to each other twice each would otherwise grow
// exponentially.
const maxSchemaNodes = 4096

// schemaError is why an input schema was refused.
type schemaError struct {
	reason string
	// path is the JSON Pointer of the offending place, "" for the root.
	path string
	msg  string
}

func (e *schemaError) Error() string {
	if e.path == "" {
		return e.msg
	}
	return e.path + ": " + e.msg
}

// Keywords whose values are schemas (JSON Schema 2020-12 and draft 7): one
// schema, a map of schemas, or an array of schemas.
var (
	schemaKeywords = []string{"items", "additionalProperties", "not", "if", "then", "else", "contains",
		"propertyNames", "unevaluatedItems", "unevaluatedProperties", "additionalItems", "contentSchema"}
	schemaMapKeywords   = []string{"properties", "patternProperties", "dependentSchemas", "$defs", "definitions"}
	schemaArrayKeywords = []string{"allOf", "anyOf", "oneOf", "prefixItems", "items"}
	// annotationKeywords may sit beside a $ref and then describe the
	// place that refers (they win over the referenced schema's).
	annotationKeywords = []string{"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment"}
	// unsupportedKeywords would make a "#..." reference mean something
	// other than a place in this document.
	unsupportedKeywords = []string{"$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"}
)

// resolveSchema checks a capability's input schema and returns it with
// every local reference ("$ref": "#/$defs/...", or any JSON Pointer into
// the document) replaced by what it refers to and the definitions
// dropped, so that what is digested, stored and shown to the model is the
// whole contract. The schema must be well-formed JSON Schema (checked by
// github.com/google/jsonschema-go) of type "object". Remote references
// are refused: a contract never depends on what another server serves.
// So are reference cycles, which cannot be written out.
func resolveSchema(in *structpb.Struct) (*structpb.Struct, *schemaError) {
	root := in.AsMap()
	raw, err := json.Marshal(root)
	if err != nil {
		return nil, &schemaError{reason: reasonInvalidSchema, msg: err.Error()}
	}
	var parsed jsonschema.Schema
	if err := json.Unmarshal(raw, &parsed); err != nil {
		return nil, &schemaError{reason: reasonInvalidSchema, msg: "not a JSON Schema: " + err.Error()}
	}
	r := &inliner{root: root, id: stringField(root, "$id")}
	if err := r.check(root, "", true); err != nil {
		return nil, err
	}
	if _, err := parsed.Resolve(nil); err != nil {
		return nil, &schemaError{reason: reasonInvalidSchema, msg: "not a valid JSON Schema: " + err.Error()}
	}
	out, serr := r.schema(root, "", nil)
	if serr != nil {
		return nil, serr
	}
	m, ok := out.(map[string]any)
	if !ok || m["type"] != "object" {
		return nil, &schemaError{reason: reasonInvalidSchema, msg: `the input schema must be a JSON Schema object with "type": "object"`}
	}
	if p, has := m["properties"]; has {
		if _, ok := p.(map[string]any); !ok {
			return nil, &schemaError{reason: reasonInvalidSchema, path: "/properties", msg: "properties must be an object"}
		}
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil, &schemaError{reason: reasonInvalidSchema, msg: err.Error()}
	}
	return s, nil
}

// inliner replaces references with what they refer to.
type inliner struct {
	root  map[string]any
	id    string // the root's $id, if any: "<id>#..." is a local reference
	nodes int
}

// check walks the document before resolution and refuses what the
// inliner cannot honour: remote references, nested identifiers and
// anchors.
func (r *inliner) check(node any, path string, isRoot bool) *schemaError {
	m, ok := node.(map[string]any)
	if !ok {
		return nil
	}
	if ref, ok := m["$ref"].(string); ok {
		if _, local := r.fragment(ref); !local {
			return &schemaError{reason: reasonRemoteRef, path: path,
				msg: fmt.Sprintf("$ref %q is not in this schema; only local references (\"#/$defs/...\") are resolved, a capability never depends on a remote document", ref)}
		}
	}
	if _, ok := m["$id"]; ok && !isRoot {
		return &schemaError{reason: reasonInvalidSchema, path: path, msg: "$id is only allowed at the root; nested identifiers change what a reference means"}
	}
	for _, k := range unsupportedKeywords {
		if _, ok := m[k]; ok {
			return &schemaError{reason: reasonInvalidSchema, path: path, msg: k + " is not supported; use $ref with a JSON Pointer into $defs"}
		}
	}
	return r.children(m, path, func(child any, childPath string) *schemaError { return r.check(child, childPath, false) })
}

// children calls fn on every subschema of m.
func (r *inliner) children(m map[string]any, path string, fn func(any, string) *schemaError) *schemaError {
	for _, k := range slicesSorted(m) {
		v := m[k]
		at := path + "/" + escapePointer(k)
		if slices.Contains(schemaMapKeywords, k) {
			sub, _ := v.(map[string]any)
			for _, name := range slicesSorted(sub) {
				if err := fn(sub[name], at+"/"+escapePointer(name)); err != nil {
					return err
				}
			}
			continue
		}
		if slices.Contains(schemaArrayKeywords, k) {
			if arr, ok := v.([]any); ok {
				for i, e := range arr {
					if err := fn(e, at+"/"+strconv.Itoa(i)); err != nil {
						return err
					}
				}
				continue
			}
		}
		if slices.Contains(schemaKeywords, k) {
			if err := fn(v, at); err != nil {
				return err
			}
		}
	}
	return nil
}

// fragment returns the JSON Pointer a reference names and whether it is a
// reference into this document.
func (r *inliner) fragment(ref string) (string, bool) {
	base, frag, found := strings.Cut(ref, "#")
	if !found || (base != "" && (r.id == "" || base != strings.TrimSuffix(r.id, "#"))) {
		return "", false
	}
	if f, err := url.PathUnescape(frag); err == nil {
		frag = f
	}
	return frag, true
}

// schema returns node with its references resolved. path is node's JSON
// Pointer in the document and stack the pointers of the schemas being
// resolved around it: a reference to one of them is a cycle.
func (r *inliner) schema(node any, path string, stack []string) (any, *schemaError) {
	r.nodes++
	if r.nodes > maxSchemaNodes {
		return nil, &schemaError{reason: reasonInvalidSchema, path: path,
			msg: fmt.Sprintf("the schema exceeds %d subschemas once its references are resolved", maxSchemaNodes)}
	}
	m, ok := node.(map[string]any)
	if !ok {
		return node, nil // true or false
	}
	stack = append(stack, path)
	out := map[string]any{}
	for k, v := range m {
		if k == "$ref" || k == "$defs" || k == "definitions" {
			continue
		}
		at := path + "/" + escapePointer(k)
		switch {
		case slices.Contains(schemaMapKeywords, k):
			sub, _ := v.(map[string]any)
			res := make(map[string]any, len(sub))
			for name, child := range sub {
				c, err := r.schema(child, at+"/"+escapePointer(name), stack)
				if err != nil {
					return nil, err
				}
				res[name] = c
			}
			out[k] = res
		case slices.Contains(schemaArrayKeywords, k) && isArray(v):
			arr := v.([]any)
			res := make([]any, len(arr))
			for i, child := range arr {
				c, err := r.schema(child, at+"/"+strconv.Itoa(i), stack)
				if err != nil {
					return nil, err
				}
				res[i] = c
			}
			out[k] = res
		case slices.Contains(schemaKeywords, k):
			c, err := r.schema(v, at, stack)
			if err != nil {
				return nil, err
			}
			out[k] = c
		default:
			out[k] = v
		}
	}
	ref, ok := m["$ref"].(string)
	if !ok {
		return out, nil
	}
	ptr, _ := r.fragment(ref)
	// A schema being resolved here that lies inside the target would be
	// reached again from it: a cycle.
	for _, p := range stack {
		if p == ptr || strings.HasPrefix(p, ptr+"/") {
			return nil, &schemaError{reason: reasonRefCycle, path: path,
				msg: fmt.Sprintf("$ref %q refers to a schema that contains this reference; a recursive schema cannot be resolved into a contract", ref)}
		}
	}
	target, err := lookupPointer(r.root, ptr)
	if err != nil {
		return nil, &schemaError{reason: reasonInvalidSchema, path: path, msg: fmt.Sprintf("$ref %q: %v", ref, err)}
	}
	resolved, serr := r.schema(target, ptr, stack)
	if serr != nil {
		return nil, serr
	}
	return mergeRef(resolved, out, path, ref)
}

// mergeRef combines a resolved reference with the keywords beside it.
// Annotations beside the reference win; another keyword must agree with
// the referenced schema's, since both apply and writing only one would
// loosen or tighten the contract.
func mergeRef(resolved any, siblings map[string]any, path, ref string) (any, *schemaError) {
	var base map[string]any
	switch v := resolved.(type) {
	case map[string]any:
		base = v
	case bool:
		if len(siblings) == 0 {
			return v, nil
		}
		if !v {
			base = map[string]any{"not": map[string]any{}}
		} else {
			base = map[string]any{}
		}
	}
	out := make(map[string]any, len(base)+len(siblings))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range siblings {
		if prev, ok := out[k]; ok && !slices.Contains(annotationKeywords, k) && !reflect.DeepEqual(prev, v) {
			return nil, &schemaError{reason: reasonInvalidSchema, path: path + "/" + escapePointer(k),
				msg: fmt.Sprintf("%s beside $ref %q differs from the referenced schema's; state the constraint in one place", k, ref)}
		}
		out[k] = v
	}
	return out, nil
}

// lookupPointer returns the value at a JSON Pointer ("" is the document).
func lookupPointer(doc any, ptr string) (any, error) {
	if ptr == "" {
		return doc, nil
	}
	if !strings.HasPrefix(ptr, "/") {
		return nil, fmt.Errorf("%q is not a JSON Pointer", ptr)
	}
	cur := doc
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[tok]
			if !ok {
				return nil, fmt.Errorf("no %q in the schema", tok)
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return nil, fmt.Errorf("no element %q in the schema", tok)
			}
			cur = v[i]
		default:
			return nil, fmt.Errorf("%q goes below a value", tok)
		}
	}
	return cur, nil
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func isArray(v any) bool { _, ok := v.([]any); return ok }

func stringField(m map[string]any, k string) string { s, _ := m[k].(string); return s }

func slicesSorted[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
