package orchestrator

import (
	"maps"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
)

func TestNormalizeArguments(t *testing.T) {
	t.Parallel()
	schema := mustStruct(t, map[string]any{
		"type": "object",
		"properties": map[string]any{
			"source":   map[string]any{"type": "string", "minLength": 2, "maxLength": 5, "description": "a handle"},
			"count":    map[string]any{"type": "integer", "minimum": 1, "maximum": 10},
			"ratio":    map[string]any{"type": "number", "minimum": 0},
			"verbose":  map[string]any{"type": "boolean"},
			"language": map[string]any{"type": "string", "enum": []any{"en", "de"}},
		},
		"required":             []any{"source"},
		"additionalProperties": false,
	})
	tests := []struct {
		name    string
		args    map[string]any
		reason  string
		fields  []string
		want    map[string]any
		noError bool
	}{
		{name: "valid, integers from JSON numbers", args: map[string]any{"source": "héllo", "count": 3.0, "ratio": 0.5, "verbose": true, "language": "de"},
			want: map[string]any{"source": "héllo", "count": int64(3), "ratio": 0.5, "verbose": true, "language": "de"}, noError: true},
		{name: "only the required field", args: map[string]any{"source": "ab"}, want: map[string]any{"source": "ab"}, noError: true},
		{name: "unknown field", args: map[string]any{"source": "ab", "path": "/etc"}, reason: reasonUnknownField, fields: []string{"arguments.path"}},
		{name: "unknown fields are all named", args: map[string]any{"source": "ab", "b": 1, "a": 1}, reason: reasonUnknownField, fields: []string{"arguments.a", "arguments.b"}},
		{name: "missing required", args: map[string]any{"count": 1}, reason: reasonMissingArgument, fields: []string{"arguments.source"}},
		{name: "no arguments at all", args: nil, reason: reasonMissingArgument, fields: []string{"arguments.source"}},
		{name: "string for integer", args: map[string]any{"source": "ab", "count": "3"}, reason: reasonArgumentType, fields: []string{"arguments.count"}},
		{name: "fraction for integer", args: map[string]any{"source": "ab", "count": 1.5}, reason: reasonArgumentType, fields: []string{"arguments.count"}},
		{name: "number for string", args: map[string]any{"source": 12}, reason: reasonArgumentType, fields: []string{"arguments.source"}},
		{name: "null for string", args: map[string]any{"source": nil}, reason: reasonArgumentType, fields: []string{"arguments.source"}},
		{name: "object for boolean", args: map[string]any{"source": "ab", "verbose": map[string]any{}}, reason: reasonArgumentType, fields: []string{"arguments.verbose"}},
		{name: "too short (runes)", args: map[string]any{"source": "é"}, reason: reasonArgumentRange, fields: []string{"arguments.source"}},
		{name: "too long", args: map[string]any{"source": "abcdef"}, reason: reasonArgumentRange, fields: []string{"arguments.source"}},
		{name: "below minimum", args: map[string]any{"source": "ab", "count": 0}, reason: reasonArgumentRange, fields: []string{"arguments.count"}},
		{name: "above maximum", args: map[string]any{"source": "ab", "count": 11}, reason: reasonArgumentRange, fields: []string{"arguments.count"}},
		{name: "negative number", args: map[string]any{"source": "ab", "ratio": -0.1}, reason: reasonArgumentRange, fields: []string{"arguments.ratio"}},
		{name: "not in enum", args: map[string]any{"source": "ab", "language": "fr"}, reason: reasonArgumentRange, fields: []string{"arguments.language"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := normalizeArguments(schema, mustStruct(t, tc.args))
			if tc.noError {
				if err != nil {
					t.Fatalf("error = %v", err)
				}
				if !maps.Equal(got, tc.want) {
					t.Fatalf("normalized = %#v, want %#v", got, tc.want)
				}
				return
			}
			if !apierror.Is(err, codes.InvalidArgument, tc.reason) {
				t.Fatalf("error = %v (reason %q), want %s", err, apierror.Reason(err), tc.reason)
			}
			if f := apierror.Fields(err); !slices.Equal(f, tc.fields) {
				t.Errorf("fields = %v, want %v", f, tc.fields)
			}
		})
	}
}

func TestNormalizedArgumentsDigestIgnoresSpelling(t *testing.T) {
	t.Parallel()
	schema := mustStruct(t, map[string]any{"type": "object", "properties": map[string]any{
		"a": map[string]any{"type": "integer"}, "b": map[string]any{"type": "string"},
	}})
	x, err := normalizeArguments(schema, mustStruct(t, map[string]any{"a": 2.0, "b": "x"}))
	if err != nil {
		t.Fatal(err)
	}
	y, err := normalizeArguments(schema, mustStruct(t, map[string]any{"b": "x", "a": 2}))
	if err != nil {
		t.Fatal(err)
	}
	dx, _ := digest.JSON(x)
	dy, _ := digest.JSON(y)
	if dx != dy {
		t.Errorf("digests differ: %s vs %s", dx, dy)
	}
}

func TestUnsupportedSchemaFailsClosed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		schema map[string]any
	}{
		{"array property", map[string]any{"type": "object", "properties": map[string]any{"xs": map[string]any{"type": "array"}}}},
		{"pattern keyword", map[string]any{"type": "object", "properties": map[string]any{"s": map[string]any{"type": "string", "pattern": "^a"}}}},
		{"non-object root", map[string]any{"type": "string"}},
		{"required without property", map[string]any{"type": "object", "required": []any{"ghost"}}},
		{"oneOf", map[string]any{"type": "object", "oneOf": []any{}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := normalizeArguments(mustStruct(t, tc.schema), nil)
			if !apierror.Is(err, codes.FailedPrecondition, reasonUnsupportedSchema) {
				t.Fatalf("error = %v, want FAILED_PRECONDITION %s", err, reasonUnsupportedSchema)
			}
		})
	}
}
