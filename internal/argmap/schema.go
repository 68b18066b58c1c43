package argmap

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
)

// Bounds on how much of a schema is expanded: remote schemas are
// observations, and one built to explode must fail review, not the
// registry.
const (
	maxRefDepth     = 32
	maxAlternatives = 64
)

// Types is a set of JSON types. Numbers are split into integers and
// numbers with a fraction, so "an integer fits a number" and "a number
// does not fit an integer" are plain set inclusion.
type Types uint8

// The JSON types.
const (
	TypeNull Types = 1 << iota
	TypeBoolean
	TypeObject
	TypeArray
	TypeString
	TypeInteger
	TypeFraction

	TypeNumber = TypeInteger | TypeFraction
	AnyType    = TypeNull | TypeBoolean | TypeObject | TypeArray | TypeString | TypeNumber
)

// TypeNamed returns the set a JSON Schema type name stands for, 0 for an
// unknown name.
func TypeNamed(name string) Types {
	switch name {
	case "null":
		return TypeNull
	case "boolean":
		return TypeBoolean
	case "object":
		return TypeObject
	case "array":
		return TypeArray
	case "string":
		return TypeString
	case "integer":
		return TypeInteger
	case "number":
		return TypeNumber
	}
	return 0
}

// TypeOf returns the type of a decoded JSON value.
func TypeOf(v any) Types {
	switch x := v.(type) {
	case nil:
		return TypeNull
	case bool:
		return TypeBoolean
	case map[string]any:
		return TypeObject
	case []any:
		return TypeArray
	case string:
		return TypeString
	case float64:
		if x == float64(int64(x)) {
			return TypeInteger
		}
		return TypeFraction
	case int, int32, int64:
		return TypeInteger
	}
	return 0
}

// Has reports whether every type of u is in t.
func (t Types) Has(u Types) bool { return u != 0 && t&u == u }

// String names the set, e.g. "string or null".
func (t Types) String() string {
	if t == 0 {
		return "nothing"
	}
	if t == AnyType {
		return "any type"
	}
	var names []string
	for _, n := range []struct {
		t    Types
		name string
	}{{TypeObject, "object"}, {TypeArray, "array"}, {TypeString, "string"}, {TypeBoolean, "boolean"}, {TypeNull, "null"}} {
		if t&n.t != 0 {
			names = append(names, n.name)
		}
	}
	switch {
	case t&TypeNumber == TypeNumber:
		names = append(names, "number")
	case t&TypeInteger != 0:
		names = append(names, "integer")
	case t&TypeFraction != 0:
		names = append(names, "number with a fraction")
	}
	return strings.Join(names, " or ")
}

// Schema is a decoded JSON Schema document. Local references ("#" and
// "#/..." JSON Pointers, e.g. "#/$defs/Options") are followed when a
// place in it is looked at; others are refused.
type Schema struct {
	doc any
}

// NewSchema wraps a decoded schema document (a map, or a boolean schema).
// A nil document is the empty object schema: it declares no field.
func NewSchema(doc any) *Schema {
	if doc == nil {
		doc = map[string]any{"type": "object"}
	}
	if m, ok := doc.(map[string]any); ok && m == nil {
		doc = map[string]any{"type": "object"}
	}
	return &Schema{doc: doc}
}

// Node is what a value at one place must satisfy: any one of its
// alternatives (anyOf, oneOf), each all of its schema objects (the schema
// itself, what its $ref names, its allOf branches). No alternative means
// nothing fits (a false schema).
type Node struct {
	s    *Schema
	alts [][]map[string]any
}

// Root returns the node of the whole document.
func (s *Schema) Root() (Node, error) {
	alts, err := s.expand(s.doc, 0)
	if err != nil {
		return Node{}, err
	}
	return Node{s: s, alts: alts}, nil
}

// expand turns a schema into alternatives of conjunctions.
func (s *Schema) expand(schema any, depth int) ([][]map[string]any, error) {
	if depth > maxRefDepth {
		return nil, fmt.Errorf("the schema nests references or combinators more than %d deep (a reference cycle?)", maxRefDepth)
	}
	switch x := schema.(type) {
	case bool:
		if x {
			return [][]map[string]any{{}}, nil
		}
		return nil, nil
	case map[string]any:
		out := [][]map[string]any{{x}}
		if ref, ok := x["$ref"]; ok {
			r, ok := ref.(string)
			if !ok {
				return nil, errors.New("$ref is not a string")
			}
			target, err := s.resolve(r)
			if err != nil {
				return nil, err
			}
			alts, err := s.expand(target, depth+1)
			if err != nil {
				return nil, err
			}
			if out, err = and(out, alts); err != nil {
				return nil, err
			}
		}
		if all, ok := x["allOf"]; ok {
			branches, ok := all.([]any)
			if !ok {
				return nil, errors.New("allOf is not an array")
			}
			for _, b := range branches {
				alts, err := s.expand(b, depth+1)
				if err != nil {
					return nil, err
				}
				if out, err = and(out, alts); err != nil {
					return nil, err
				}
			}
		}
		for _, kw := range []string{"anyOf", "oneOf"} {
			raw, ok := x[kw]
			if !ok {
				continue
			}
			branches, ok := raw.([]any)
			if !ok {
				return nil, fmt.Errorf("%s is not an array", kw)
			}
			var union [][]map[string]any
			for _, b := range branches {
				alts, err := s.expand(b, depth+1)
				if err != nil {
					return nil, err
				}
				union = append(union, alts...)
			}
			if len(union) > maxAlternatives {
				return nil, fmt.Errorf("the schema has more than %d alternatives", maxAlternatives)
			}
			var err error
			if out, err = and(out, union); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("a schema must be an object or a boolean, not %s", Describe(schema))
}

// and is the conjunction of two sets of alternatives.
func and(a, b [][]map[string]any) ([][]map[string]any, error) {
	if len(a)*len(b) > maxAlternatives {
		return nil, fmt.Errorf("the schema has more than %d alternatives", maxAlternatives)
	}
	out := make([][]map[string]any, 0, len(a)*len(b))
	for _, x := range a {
		for _, y := range b {
			out = append(out, append(slices.Clip(x), y...))
		}
	}
	return out, nil
}

// resolve follows a local reference.
func (s *Schema) resolve(ref string) (any, error) {
	frag, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil, fmt.Errorf("reference %q is not local: only references into the same schema (#/...) are followed", ref)
	}
	frag, err := url.PathUnescape(frag)
	if err != nil {
		return nil, fmt.Errorf("reference %q: %w", ref, err)
	}
	if frag == "" {
		return s.doc, nil
	}
	if !strings.HasPrefix(frag, "/") {
		return nil, fmt.Errorf("reference %q names an anchor; only JSON Pointers (#/...) are followed", ref)
	}
	cur := s.doc
	for _, raw := range strings.Split(frag[1:], "/") {
		tok, err := unescape(raw)
		if err != nil {
			return nil, fmt.Errorf("reference %q: %w", ref, err)
		}
		switch c := cur.(type) {
		case map[string]any:
			next, ok := c[tok]
			if !ok {
				return nil, fmt.Errorf("reference %q names nothing in the schema", ref)
			}
			cur = next
		case []any:
			n, ok := Index(tok)
			if !ok || n >= len(c) {
				return nil, fmt.Errorf("reference %q names nothing in the schema", ref)
			}
			cur = c[n]
		default:
			return nil, fmt.Errorf("reference %q names nothing in the schema", ref)
		}
	}
	return cur, nil
}

// Impossible reports whether nothing fits the node.
func (n Node) Impossible() bool { return len(n.alts) == 0 }

// Types returns every type some alternative admits.
func (n Node) Types() Types {
	var t Types
	for _, alt := range n.alts {
		t |= altTypes(alt)
	}
	return t
}

// altTypes is the intersection of what each schema of an alternative
// admits: its type keyword, and the types of its const or enum values.
func altTypes(alt []map[string]any) Types {
	t := AnyType
	for _, c := range alt {
		switch ty := c["type"].(type) {
		case string:
			t &= TypeNamed(ty)
		case []any:
			var u Types
			for _, x := range ty {
				if name, ok := x.(string); ok {
					u |= TypeNamed(name)
				}
			}
			t &= u
		}
		if v, ok := c["const"]; ok {
			t &= TypeOf(v)
		}
		if e, ok := c["enum"].([]any); ok {
			var u Types
			for _, v := range e {
				u |= TypeOf(v)
			}
			t &= u
		}
	}
	return t
}

// Closed reports whether every alternative admitting a type in t admits
// only listed values (enum or const), so an arbitrary value of that type
// does not fit.
func (n Node) Closed(t Types) bool {
	found := false
	for _, alt := range n.alts {
		if altTypes(alt)&t == 0 {
			continue
		}
		found = true
		if !slices.ContainsFunc(alt, func(c map[string]any) bool {
			_, isConst := c["const"]
			_, isEnum := c["enum"]
			return isConst || isEnum
		}) {
			return false
		}
	}
	return found
}

// Values returns the values the node lists (enum and const) when every
// alternative lists its values, and whether it does.
func (n Node) Values() ([]any, bool) {
	if len(n.alts) == 0 || !n.Closed(AnyType) {
		return nil, false
	}
	var out []any
	for _, alt := range n.alts {
		for _, c := range alt {
			if v, ok := c["const"]; ok {
				out = append(out, v)
			}
			if e, ok := c["enum"].([]any); ok {
				out = append(out, e...)
			}
		}
	}
	return out, true
}

// FieldStatus says what a schema makes of an object field.
type FieldStatus int

// Field statuses.
const (
	// FieldDeclared: the field is declared (properties, a matching
	// patternProperties, or an additionalProperties schema).
	FieldDeclared FieldStatus = iota
	// FieldUndeclared: no alternative declares it. Undeclared fields are
	// refused even where a schema would let them through: remote extras
	// never slip through unreviewed.
	FieldUndeclared
	// FieldNotObject: no alternative admits an object here.
	FieldNotObject
)

// Field returns the node of an object field.
func (n Node) Field(name string) (Node, FieldStatus, error) {
	status := FieldNotObject
	var out [][]map[string]any
	for _, alt := range n.alts {
		if altTypes(alt)&TypeObject == 0 {
			continue
		}
		if status == FieldNotObject {
			status = FieldUndeclared
		}
		var child []any
		declared, forbidden := false, false
		for _, c := range alt {
			if props, ok := c["properties"].(map[string]any); ok {
				if p, ok := props[name]; ok {
					child, declared = append(child, p), true
					continue
				}
			}
			matched := false
			if pats, ok := c["patternProperties"].(map[string]any); ok {
				for _, pat := range slices.Sorted(maps.Keys(pats)) {
					re, err := regexp.Compile(pat)
					if err != nil {
						return Node{}, 0, fmt.Errorf("patternProperties %q: %w", pat, err)
					}
					if re.MatchString(name) {
						child, declared, matched = append(child, pats[pat]), true, true
					}
				}
			}
			if matched {
				continue
			}
			switch ap := c["additionalProperties"].(type) {
			case bool:
				forbidden = forbidden || !ap
			case map[string]any:
				child, declared = append(child, ap), true
			}
		}
		if forbidden || !declared {
			continue
		}
		alts := [][]map[string]any{{}}
		for _, ch := range child {
			x, err := n.s.expand(ch, 0)
			if err != nil {
				return Node{}, 0, err
			}
			if alts, err = and(alts, x); err != nil {
				return Node{}, 0, err
			}
		}
		status = FieldDeclared
		out = append(out, alts...)
		if len(out) > maxAlternatives {
			return Node{}, 0, fmt.Errorf("the schema has more than %d alternatives", maxAlternatives)
		}
	}
	return Node{s: n.s, alts: out}, status, nil
}

// FieldNames returns the fields the node declares by name, sorted.
func (n Node) FieldNames() []string {
	seen := map[string]bool{}
	for _, alt := range n.alts {
		for _, c := range alt {
			if props, ok := c["properties"].(map[string]any); ok {
				for k := range props {
					seen[k] = true
				}
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// Element returns the node of array element i and whether some
// alternative admits an array here.
func (n Node) Element(i int) (Node, bool, error) {
	isArray := false
	var out [][]map[string]any
	for _, alt := range n.alts {
		if altTypes(alt)&TypeArray == 0 {
			continue
		}
		isArray = true
		var child []any
		for _, c := range alt {
			if prefix, ok := c["prefixItems"].([]any); ok {
				if i < len(prefix) {
					child = append(child, prefix[i])
				} else if items, ok := c["items"]; ok {
					child = append(child, items)
				}
				continue
			}
			switch items := c["items"].(type) {
			case []any: // draft-07 tuple
				if i < len(items) {
					child = append(child, items[i])
				} else if more, ok := c["additionalItems"]; ok {
					child = append(child, more)
				}
			case nil:
			default:
				child = append(child, items)
			}
		}
		alts := [][]map[string]any{{}}
		for _, ch := range child {
			x, err := n.s.expand(ch, 0)
			if err != nil {
				return Node{}, false, err
			}
			if alts, err = and(alts, x); err != nil {
				return Node{}, false, err
			}
		}
		out = append(out, alts...)
		if len(out) > maxAlternatives {
			return Node{}, false, fmt.Errorf("the schema has more than %d alternatives", maxAlternatives)
		}
	}
	return Node{s: n.s, alts: out}, isArray, nil
}

// Required returns, for each alternative admitting an object, the fields
// it requires, sorted.
func (n Node) Required() [][]string {
	var out [][]string
	for _, alt := range n.alts {
		if altTypes(alt)&TypeObject == 0 {
			continue
		}
		seen := map[string]bool{}
		for _, c := range alt {
			if req, ok := c["required"].([]any); ok {
				for _, r := range req {
					if s, ok := r.(string); ok {
						seen[s] = true
					}
				}
			}
		}
		out = append(out, slices.Sorted(maps.Keys(seen)))
	}
	return out
}

// Bounds is the number of items an array alternative accepts; Max < 0
// means no maximum.
type Bounds struct{ Min, Max int }

// ItemBounds returns, for each alternative admitting an array, the number
// of items it accepts.
func (n Node) ItemBounds() []Bounds {
	var out []Bounds
	for _, alt := range n.alts {
		if altTypes(alt)&TypeArray == 0 {
			continue
		}
		b := Bounds{Max: -1}
		for _, c := range alt {
			if v, ok := c["minItems"].(float64); ok && int(v) > b.Min {
				b.Min = int(v)
			}
			if v, ok := c["maxItems"].(float64); ok && (b.Max < 0 || int(v) < b.Max) {
				b.Max = int(v)
			}
		}
		out = append(out, b)
	}
	return out
}

// documentKey is where Validate puts the whole document, so references
// from the node's schemas into it still resolve.
const documentKey = "v0m3_document"

// Validate checks a decoded JSON value against the node with
// github.com/google/jsonschema-go: every keyword it implements applies
// (type, enum, const, lengths, patterns, bounds, not, if/then/else...).
func (n Node) Validate(v any) error {
	if len(n.alts) == 0 {
		return errors.New("the schema admits no value here")
	}
	// The document goes where the wrapper's draft keeps definitions.
	defsKey := "$defs"
	wrapper := map[string]any{}
	if root, ok := n.s.doc.(map[string]any); ok {
		if d, _ := root["$schema"].(string); strings.Contains(d, "draft-07") {
			wrapper["$schema"] = "http://json-schema.org/draft-07/schema#"
			defsKey = "definitions"
		}
	}
	prefix := "#/" + defsKey + "/" + documentKey
	branches := make([]any, 0, len(n.alts))
	for _, alt := range n.alts {
		all := make([]any, 0, len(alt))
		for _, c := range alt {
			all = append(all, relocate(c, prefix))
		}
		branches = append(branches, map[string]any{"allOf": all})
	}
	if len(branches) == 1 {
		wrapper["allOf"] = branches[0].(map[string]any)["allOf"]
	} else {
		wrapper["anyOf"] = branches
	}
	wrapper[defsKey] = map[string]any{documentKey: relocate(n.s.doc, prefix)}
	raw, err := json.Marshal(wrapper)
	if err != nil {
		return fmt.Errorf("the schema cannot be encoded: %w", err)
	}
	var sch jsonschema.Schema
	if err := json.Unmarshal(raw, &sch); err != nil {
		return fmt.Errorf("the schema cannot be read: %w", err)
	}
	rs, err := sch.Resolve(nil)
	if err != nil {
		return fmt.Errorf("the schema cannot be resolved: %w", err)
	}
	if err := rs.Validate(v); err != nil {
		return errors.New(simplify(err.Error()))
	}
	return nil
}

// relocate copies a schema, pointing its local references at the copy
// of the document at prefix inside the Validate wrapper, and drops what
// would change how that copy resolves ($id, $schema).
func relocate(v any, prefix string) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			switch k {
			case "$id", "$schema":
				continue
			case "$ref":
				if r, ok := e.(string); ok && strings.HasPrefix(r, "#") {
					out[k] = prefix + strings.TrimPrefix(r, "#")
					continue
				}
			}
			out[k] = relocate(e, prefix)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = relocate(e, prefix)
		}
		return out
	}
	return v
}

// simplify drops jsonschema-go's "validating <location>: " prefixes, whose
// locations name the wrapper Validate built rather than anything a
// reviewer wrote, keeping the keyword and why, e.g. "enum: c does not
// equal any of: [a b]".
func simplify(msg string) string {
	for strings.HasPrefix(msg, "validating ") {
		_, rest, ok := strings.Cut(msg, ": ")
		if !ok {
			break
		}
		msg = rest
	}
	return msg
}
