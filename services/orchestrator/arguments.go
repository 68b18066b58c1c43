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

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/argmap"
	"github.com/v0m3/v0m3/internal/bounds"
	"github.com/v0m3/v0m3/internal/productschema"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Argument refusal reasons.
const (
	reasonUnknownField      = "UNKNOWN_ARGUMENT_FIELD"
	reasonMissingArgument   = "MISSING_ARGUMENT"
	reasonArgumentType      = "INVALID_ARGUMENT_TYPE"
	reasonArgumentRange     = "ARGUMENT_OUT_OF_RANGE"
	reasonUnsupportedSchema = "UNSUPPORTED_SCHEMA_KEYWORD"
)

// maxSafeInteger is the largest integer a JSON number carries exactly.
const maxSafeInteger = 1<<53 - 1

// normalizeArguments checks the model's arguments against a capability's
// product input schema and returns them normalized: strings, int64 for
// integer fields, float64 for number fields, bools.
//
// The validator is deliberately small and strict: it understands the
// subset internal/productschema defines, which the registry also
// holds declarations to. Unknown argument fields always fail, whatever
// additionalProperties says: the design rule is that remote or model
// supplied extras never slip through. A schema using anything else (one
// declared before the registry refused it) fails closed with
// FAILED_PRECONDITION, because an unreviewed keyword could be a
// constraint we would otherwise silently skip.
func normalizeArguments(schema, args *structpb.Struct) (map[string]any, error) {
	parsed, err := productschema.Parse(schema)
	if err != nil {
		return nil, apierror.New(codes.FailedPrecondition, reasonUnsupportedSchema,
			"the capability's input schema cannot be enforced: "+err.Error(), nil)
	}
	props, required := parsed.Properties, parsed.Required
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
		v, err := normalize(props[name], name, fields[name])
		if err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, nil
}

// normalize checks one argument against its property and returns it
// normalized.
func normalize(p productschema.Property, name string, v *structpb.Value) (any, error) {
	wrongType := func() error {
		return apierror.InvalidArgument(reasonArgumentType,
			fmt.Sprintf("argument %q must be a %s, got %s", name, p.Type, kindName(v)),
			apierror.FieldViolation{Field: "arguments." + name, Description: "must be a " + p.Type})
	}
	outOfRange := func(format string, a ...any) error {
		d := fmt.Sprintf(format, a...)
		return apierror.InvalidArgument(reasonArgumentRange, fmt.Sprintf("argument %q %s", name, d),
			apierror.FieldViolation{Field: "arguments." + name, Description: d})
	}
	switch p.Type {
	case "string":
		sv, ok := v.GetKind().(*structpb.Value_StringValue)
		if !ok {
			return nil, wrongType()
		}
		n := utf8.RuneCountInString(sv.StringValue)
		if p.MinLength != nil && n < *p.MinLength {
			return nil, outOfRange("must be at least %d characters long", *p.MinLength)
		}
		if p.MaxLength != nil && n > *p.MaxLength {
			return nil, outOfRange("must be at most %d characters long", *p.MaxLength)
		}
		if len(p.Enum) > 0 && !slices.Contains(p.Enum, sv.StringValue) {
			return nil, outOfRange("must be one of %s", strings.Join(quoteAll(p.Enum), ", "))
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
		if p.Minimum != nil && f < *p.Minimum {
			return nil, outOfRange("must be at least %v", *p.Minimum)
		}
		if p.Maximum != nil && f > *p.Maximum {
			return nil, outOfRange("must be at most %v", *p.Maximum)
		}
		if p.Type == "number" {
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
// with the rules review type-checked them by (internal/argmap):
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
