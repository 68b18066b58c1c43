package evidence

import (
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
)

// Redacted replaces the value of any field whose name looks secret.
const Redacted = "[redacted]"

// secretKeyParts are the fragments that make a field name look secret.
// Callers are supposed to send only safe arguments; this is defense in
// depth, so it errs toward redacting too much. Names are compared
// lower-cased with "-" and "_" removed, so "api_key", "API-Key" and
// "apikey" all match.
var secretKeyParts = []string{"token", "secret", "password", "credential", "authorization", "apikey"}

func secretKey(k string) bool {
	n := strings.NewReplacer("_", "", "-", "").Replace(strings.ToLower(k))
	for _, p := range secretKeyParts {
		if strings.Contains(n, p) {
			return true
		}
	}
	return false
}

// redactStruct replaces, in place and at any depth (inside nested objects
// and lists), the value of every field whose name looks secret.
func redactStruct(s *structpb.Struct) {
	for k, v := range s.GetFields() {
		if secretKey(k) {
			s.Fields[k] = structpb.NewStringValue(Redacted)
			continue
		}
		redactValue(v)
	}
}

func redactValue(v *structpb.Value) {
	switch x := v.GetKind().(type) {
	case *structpb.Value_StructValue:
		redactStruct(x.StructValue)
	case *structpb.Value_ListValue:
		for _, e := range x.ListValue.GetValues() {
			redactValue(e)
		}
	}
}
