// Package productschema is the one definition of the JSON Schema subset a
// capability's product input schema may use: the registry refuses a
// declaration outside it, and the orchestrator enforces a request's
// arguments by it. The subset is deliberately small and strict: type
// object; properties of type string, integer, number or boolean;
// required; additionalProperties (always applied in its strictest form);
// minLength, maxLength, minimum, maximum, enum; and documentation
// keywords. Anything else is refused, because an unreviewed keyword could
// be a constraint that would otherwise be silently skipped.
package productschema

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"

	"google.golang.org/protobuf/types/known/structpb"
)

// Schema is a parsed product input schema.
type Schema struct {
	// Properties are the argument fields by name.
	Properties map[string]Property
	// Required are the required fields, sorted.
	Required []string
}

// Property is one argument field.
type Property struct {
	// Type is "string", "integer", "number" or "boolean".
	Type      string
	MinLength *int
	MaxLength *int
	Minimum   *float64
	Maximum   *float64
	// Enum, when set, lists the only values a string may take.
	Enum []string
}

// UnsupportedError says why a schema is outside the subset.
type UnsupportedError struct {
	// Property is the property at fault, "" at the top level.
	Property string
	// Keyword is the keyword at fault, "" when no one keyword is.
	Keyword string
	// Msg says what is wrong.
	Msg string
}

func (e *UnsupportedError) Error() string {
	if e.Property == "" {
		return e.Msg
	}
	return fmt.Sprintf("property %q: %s", e.Property, e.Msg)
}

// Documentation keywords: said to the model, never a constraint.
var (
	topLevelDocs = map[string]bool{"additionalProperties": true, "$schema": true, "title": true, "description": true, "$id": true}
	propertyDocs = map[string]bool{"description": true, "title": true, "examples": true, "format": true}
)

// Parse returns schema parsed, or an *UnsupportedError. A nil schema has
// no properties.
func Parse(schema *structpb.Struct) (*Schema, error) {
	out := &Schema{Properties: map[string]Property{}}
	if schema == nil {
		return out, nil
	}
	// Keys in order, so the keyword at fault is the same every time.
	for _, key := range slices.Sorted(maps.Keys(schema.GetFields())) {
		v := schema.GetFields()[key]
		switch key {
		case "type":
			if v.GetStringValue() != "object" {
				return nil, &UnsupportedError{Keyword: key, Msg: "top-level type must be object"}
			}
		case "required":
			for _, r := range v.GetListValue().GetValues() {
				out.Required = append(out.Required, r.GetStringValue())
			}
		case "properties":
			props := v.GetStructValue().GetFields()
			for _, name := range slices.Sorted(maps.Keys(props)) {
				p, err := parseProperty(props[name].GetStructValue())
				if err != nil {
					err.Property = name
					return nil, err
				}
				out.Properties[name] = p
			}
		default:
			// additionalProperties is a rule always applied in its
			// strictest form; the others are documentation.
			if !topLevelDocs[key] {
				return nil, &UnsupportedError{Keyword: key, Msg: fmt.Sprintf("keyword %q is not supported", key)}
			}
		}
	}
	sort.Strings(out.Required)
	for _, r := range out.Required {
		if _, ok := out.Properties[r]; !ok {
			return nil, &UnsupportedError{Keyword: "required", Msg: fmt.Sprintf("required field %q has no property", r)}
		}
	}
	return out, nil
}

func parseProperty(s *structpb.Struct) (Property, *UnsupportedError) {
	var p Property
	num := func(v *structpb.Value) (float64, error) {
		if _, ok := v.GetKind().(*structpb.Value_NumberValue); !ok {
			return 0, fmt.Errorf("expected a number")
		}
		return v.GetNumberValue(), nil
	}
	length := func(v *structpb.Value) (*int, error) {
		f, err := num(v)
		if err != nil || f < 0 || f != math.Trunc(f) {
			return nil, fmt.Errorf("length must be a non-negative integer")
		}
		n := int(f)
		return &n, nil
	}
	for _, key := range slices.Sorted(maps.Keys(s.GetFields())) {
		v := s.GetFields()[key]
		var err error
		switch key {
		case "type":
			p.Type = v.GetStringValue()
			switch p.Type {
			case "string", "integer", "number", "boolean":
			default:
				return p, &UnsupportedError{Keyword: key, Msg: fmt.Sprintf("type %q is not supported", p.Type)}
			}
		case "minLength":
			p.MinLength, err = length(v)
		case "maxLength":
			p.MaxLength, err = length(v)
		case "minimum":
			var f float64
			f, err = num(v)
			p.Minimum = &f
		case "maximum":
			var f float64
			f, err = num(v)
			p.Maximum = &f
		case "enum":
			for _, e := range v.GetListValue().GetValues() {
				sv, ok := e.GetKind().(*structpb.Value_StringValue)
				if !ok {
					return p, &UnsupportedError{Keyword: key, Msg: "enum values must be strings"}
				}
				p.Enum = append(p.Enum, sv.StringValue)
			}
		default:
			// "format" is advisory in JSON Schema too.
			if !propertyDocs[key] {
				return p, &UnsupportedError{Keyword: key, Msg: fmt.Sprintf("keyword %q is not supported", key)}
			}
		}
		if err != nil {
			return p, &UnsupportedError{Keyword: key, Msg: fmt.Sprintf("%s: %v", key, err)}
		}
	}
	if p.Type == "" {
		return p, &UnsupportedError{Keyword: "type", Msg: "type is required"}
	}
	return p, nil
}
