// Package redact is the one rule for secret-looking fields in structured
// arguments: the adapter applies it before a protocol trace or fixture is
// written, and evidence applies it again to whatever it stores, as defense
// in depth.
package redact

import (
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
)

// Placeholder replaces the value of every secret-looking field.
const Placeholder = "[redacted]"

// secretKeyParts make a field name look secret. The rule errs toward
// redacting too much: "key" also covers "api_key" and "apikey".
var secretKeyParts = []string{"token", "secret", "password", "key", "credential", "authorization"}

var separators = strings.NewReplacer("_", "", "-", "")

// SecretKey reports whether a field name looks secret. Names are compared
// lower-cased with "-" and "_" removed, so "API-Key" and "pass_word" match.
func SecretKey(name string) bool {
	n := separators.Replace(strings.ToLower(name))
	for _, p := range secretKeyParts {
		if strings.Contains(n, p) {
			return true
		}
	}
	return false
}

// Struct returns a copy of s in which the value of every secret-looking
// field, at any depth (nested objects and lists), is Placeholder. It
// returns nil for nil.
func Struct(s *structpb.Struct) *structpb.Struct {
	if s == nil {
		return nil
	}
	out := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(s.GetFields()))}
	for k, v := range s.GetFields() {
		if SecretKey(k) {
			out.Fields[k] = structpb.NewStringValue(Placeholder)
			continue
		}
		out.Fields[k] = value(v)
	}
	return out
}

func value(v *structpb.Value) *structpb.Value {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StructValue:
		return structpb.NewStructValue(Struct(k.StructValue))
	case *structpb.Value_ListValue:
		l := &structpb.ListValue{Values: make([]*structpb.Value, 0, len(k.ListValue.GetValues()))}
		for _, e := range k.ListValue.GetValues() {
			l.Values = append(l.Values, value(e))
		}
		return structpb.NewListValue(l)
	default:
		return v
	}
}
