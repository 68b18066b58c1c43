package orchestrator

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/internal/apierror"
	"github.com/v0m3/v0m3/services/internal/argmap"
	"github.com/v0m3/v0m3/services/internal/bounds"
)

// Argument refusal reasons.
const (
	reasonUnknownField      = "UNKNOWN_ARGUMENT_FIELD"
	reasonMissingArgument   = "MISSING_ARGUMENT"
	reasonArgumentType      = "INVALID_ARGUMENT_TYPE"
	reasonArgumentRange     = "ARGUMENT_OUT_OF_RANGE"
	reasonUnsupportedSchema = "UNSUPPORTED_SCHEMA"
)

// maxSafeInteger is the largest integer a JSON number carries exactly.
const maxSafeInteger = 1<<53 - 1

// normalizeArguments checks the model's arguments against a capability's
// product input schema and returns them normalized: strings, int64 for
// integer fields, float64 for number fields, bools.
//
// The validator is deliberately small and strict. It understands the subset
// product schemas use (type object; properties of type string, integer,
// number or boolean; required; additionalProperties; minLength, maxLength,
// minimum, maximum, enum). Unknown argument fields always fail, whatever
// additionalProperties says: the design rule is that remote or model
// supplied extras never slip through. A schema using anything else fails
// closed with FAILED_PRECONDITION, because an unreviewed keyword could be a
// constraint we would otherwise silently skip.
func normalizeArguments(schema, args *structpb.Struct) (map[string]any, error) {
	props, required, err := parseSchema(schema)
	if err != nil {
		return nil, err
	}
	fields := args.GetFields()

	var unknown []string
	for name := range fields {
		if _, ok := props[name]; !ok {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		// The names are the caller's: quoted bounded, however many or long.
		shown, more := bounds.Names(unknown)
		listed := strings.Join(quoteAll(shown), ", ")
		if more > 0 {
			listed += fmt.Sprintf(" and %d more", more)
		}
		return nil, apierror.InvalidArgument(reasonUnknownField,
			fmt.Sprintf("unknown argument field %s; the capability accepts: %s", listed, strings.Join(quoteAll(slices.Sorted(maps.Keys(props))), ", ")),
			violations(shown, "not a field of the capability's input schema")...)
	}

	var missing []string
	for _, name := range required {
		if _, ok := fields[name]; !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return nil, apierror.InvalidArgument(reasonMissingArgument,
			"missing required argument "+strings.Join(quoteAll(missing), ", "),
			violations(missing, "required")...)
	}

	out := make(map[string]any, len(fields))
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		v, err := props[name].normalize(name, fields[name])
		if err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, nil
}

// property is one property of the supported schema subset.
type property struct {
	typ       string
	minLength *int
	maxLength *int
	minimum   *float64
	maximum   *float64
	enum      []string
}

func parseSchema(schema *structpb.Struct) (map[string]property, []string, error) {
	unsupported := func(format string, a ...any) error {
		return apierror.New(codes.FailedPrecondition, reasonUnsupportedSchema,
			"the capability's input schema cannot be enforced: "+fmt.Sprintf(format, a...), nil)
	}
	props := map[string]property{}
	if schema == nil {
		return props, nil, nil
	}
	var required []string
	for key, v := range schema.GetFields() {
		switch key {
		case "type":
			if v.GetStringValue() != "object" {
				return nil, nil, unsupported("top-level type must be object")
			}
		case "required":
			for _, r := range v.GetListValue().GetValues() {
				required = append(required, r.GetStringValue())
			}
		case "properties":
			for name, pv := range v.GetStructValue().GetFields() {
				p, err := parseProperty(pv.GetStructValue())
				if err != nil {
					return nil, nil, unsupported("property %q: %v", name, err)
				}
				props[name] = p
			}
		case "additionalProperties", "$schema", "title", "description", "$id":
			// Documentation, or (additionalProperties) a rule this validator
			// always applies in its strictest form.
		default:
			return nil, nil, unsupported("keyword %q is not supported", key)
		}
	}
	sort.Strings(required)
	for _, r := range required {
		if _, ok := props[r]; !ok {
			return nil, nil, unsupported("required field %q has no property", r)
		}
	}
	return props, required, nil
}

func parseProperty(s *structpb.Struct) (property, error) {
	var p property
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
	for key, v := range s.GetFields() {
		var err error
		switch key {
		case "type":
			p.typ = v.GetStringValue()
			switch p.typ {
			case "string", "integer", "number", "boolean":
			default:
				return p, fmt.Errorf("type %q is not supported", p.typ)
			}
		case "minLength":
			p.minLength, err = length(v)
		case "maxLength":
			p.maxLength, err = length(v)
		case "minimum":
			var f float64
			f, err = num(v)
			p.minimum = &f
		case "maximum":
			var f float64
			f, err = num(v)
			p.maximum = &f
		case "enum":
			for _, e := range v.GetListValue().GetValues() {
				sv, ok := e.GetKind().(*structpb.Value_StringValue)
				if !ok {
					return p, fmt.Errorf("enum values must be strings")
				}
				p.enum = append(p.enum, sv.StringValue)
			}
		case "description", "title", "examples", "format":
			// Documentation for the model; not a constraint we enforce.
			// ("format" is advisory in JSON Schema too.)
		default:
			return p, fmt.Errorf("keyword %q is not supported", key)
		}
		if err != nil {
			return p, fmt.Errorf("%s: %w", key, err)
		}
	}
	if p.typ == "" {
		return p, fmt.Errorf("type is required")
	}
	return p, nil
}

func (p property) normalize(name string, v *structpb.Value) (any, error) {
	wrongType := func() error {
		return apierror.InvalidArgument(reasonArgumentType,
			fmt.Sprintf("argument %q must be a %s, got %s", name, p.typ, kindName(v)),
			apierror.FieldViolation{Field: "arguments." + name, Description: "must be a " + p.typ})
	}
	outOfRange := func(format string, a ...any) error {
		d := fmt.Sprintf(format, a...)
		return apierror.InvalidArgument(reasonArgumentRange, fmt.Sprintf("argument %q %s", name, d),
			apierror.FieldViolation{Field: "arguments." + name, Description: d})
	}
	switch p.typ {
	case "string":
		sv, ok := v.GetKind().(*structpb.Value_StringValue)
		if !ok {
			return nil, wrongType()
		}
		n := utf8.RuneCountInString(sv.StringValue)
		if p.minLength != nil && n < *p.minLength {
			return nil, outOfRange("must be at least %d characters long", *p.minLength)
		}
		if p.maxLength != nil && n > *p.maxLength {
			return nil, outOfRange("must be at most %d characters long", *p.maxLength)
		}
		if len(p.enum) > 0 && !slices.Contains(p.enum, sv.StringValue) {
			return nil, outOfRange("must be one of %s", strings.Join(quoteAll(p.enum), ", "))
		}
		return sv.StringValue, nil
	case "boolean":
		bv, ok := v.GetKind().(*structpb.Value_BoolValue)
		if !ok {
			return nil, wrongType()
		}
		return bv.BoolValue, nil
	case "integer", "number":
		nv, ok := v.GetKind().(*structpb.Value_NumberValue)
		if !ok {
			return nil, wrongType()
		}
		f := nv.NumberValue
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, wrongType()
		}
		if p.minimum != nil && f < *p.minimum {
			return nil, outOfRange("must be at least %v", *p.minimum)
		}
		if p.maximum != nil && f > *p.maximum {
			return nil, outOfRange("must be at most %v", *p.maximum)
		}
		if p.typ == "number" {
			return f, nil
		}
		if f != math.Trunc(f) || math.Abs(f) > maxSafeInteger {
			return nil, wrongType()
		}
		return int64(f), nil
	}
	return nil, wrongType()
}

func kindName(v *structpb.Value) string {
	switch v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return "a string"
	case *structpb.Value_NumberValue:
		return "a number"
	case *structpb.Value_BoolValue:
		return "a boolean"
	case *structpb.Value_StructValue:
		return "an object"
	case *structpb.Value_ListValue:
		return "an array"
	default:
		return "null"
	}
}

func violations(fields []string, description string) []apierror.FieldViolation {
	out := make([]apierror.FieldViolation, 0, len(fields))
	for _, f := range fields {
		out = append(out, apierror.FieldViolation{Field: "arguments." + f, Description: description})
	}
	return out
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

// remoteArguments builds the remote call's arguments from the mapping,
// with the rules review type-checked them by (services/internal/argmap):
// reviewed defaults first, then each binding in map order at its path,
// creating the objects and arrays on the way ("-" appends), so a binding
// wins over a default at the same path and the defaults around it stay.
// A bound product field keeps its normalized type (an integer stays an
// integer); a handle field carries its resolved server-side target, never
// the token; a constant is sent as reviewed. A product field the request
// does not carry is left out. A resource read has no arguments: its
// target is the read (see callTarget).
func remoteArguments(m *registryv1.Mapping, normalized map[string]any, targets map[string]string) (*structpb.Struct, error) {
	if m.GetTarget().GetKind() == registryv1.RemoteKind_REMOTE_KIND_RESOURCE {
		return &structpb.Struct{Fields: map[string]*structpb.Value{}}, nil
	}
	remote := m.GetDefaults().AsMap()
	if remote == nil {
		remote = map[string]any{}
	}
	for i, b := range m.GetArgumentMap() {
		at, err := argmap.Parse(b.GetRemoteField())
		if err != nil {
			return nil, fmt.Errorf("argument_map[%d].remote_field: %w", i, err)
		}
		var v any
		switch {
		case b.GetConstant() != nil:
			v = b.GetConstant().AsInterface()
		case b.GetFromHandle():
			field, err := handleField(b)
			if err != nil {
				return nil, fmt.Errorf("argument_map[%d].product_field: %w", i, err)
			}
			if _, ok := normalized[field]; !ok {
				continue
			}
			t, ok := targets[field]
			if !ok {
				return nil, fmt.Errorf("product field %q is bound from a handle but the capability does not declare it a handle field", field)
			}
			v = t
		default:
			from, err := argmap.Parse(b.GetProductField())
			if err != nil {
				return nil, fmt.Errorf("argument_map[%d].product_field: %w", i, err)
			}
			var ok bool
			if v, ok = argmap.Get(normalized, from); !ok {
				continue
			}
		}
		if _, err := argmap.Set(remote, at, v); err != nil {
			return nil, fmt.Errorf("argument_map[%d].remote_field %s: %w", i, at, err)
		}
	}
	return structpb.NewStruct(remote)
}

// handleField is the handle field a from_handle binding names. Handle
// fields are top-level product fields, named as such or by a one-token
// pointer.
func handleField(b *registryv1.ArgumentBinding) (string, error) {
	p, err := argmap.Parse(b.GetProductField())
	if err != nil {
		return "", err
	}
	if len(p) != 1 {
		return "", fmt.Errorf("%q is not a handle field: handle fields are top-level", b.GetProductField())
	}
	return p[0], nil
}
