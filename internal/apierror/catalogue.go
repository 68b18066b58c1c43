package apierror

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	errorsv1 "github.com/v0m3/v0m3/proto/v0m3/errors/v1"
)

// Reasons every service returns for the same rule: one rule has one
// reason everywhere (proto/v0m3/errors/v1/errors.proto).
const (
	// ReasonFieldRequired: a field the call needs is missing.
	ReasonFieldRequired = "FIELD_REQUIRED"
	// ReasonFieldInvalid: a field is set but malformed.
	ReasonFieldInvalid = "FIELD_INVALID"
	// ReasonStoreFailure: the service's store failed in a way a retry
	// will not fix.
	ReasonStoreFailure = "STORE_FAILURE"
)

// Entry is one reason of the catalogue.
type Entry struct {
	// Domain is the API domain whose enum declares the reason, e.g.
	// "Registry" for RegistryErrorReason.
	Domain string
	// Reason is the ErrorInfo reason (or attempt safe code).
	Reason string
	// Codes are the gRPC code names it is returned with; none for a
	// reason that is only a safe code or a diagnostic.
	Codes []string
	// Value is the enum value that declares it; its source comment says
	// when it is returned and what to do.
	Value protoreflect.EnumValueDescriptor
}

var (
	catalogueOnce sync.Once
	catalogue     []Entry
	byReason      map[string]Entry
)

// load reads the catalogue from the errors.proto enum descriptors: a
// reason is a value's name without the prefix its zero value carries
// (COMMON_ERROR_REASON_UNSPECIFIED: COMMON_ERROR_REASON_).
func load() {
	byReason = map[string]Entry{}
	enums := errorsv1.File_v0m3_errors_v1_errors_proto.Enums()
	for i := range enums.Len() {
		ed := enums.Get(i)
		prefix := strings.TrimSuffix(string(ed.Values().ByNumber(0).Name()), "UNSPECIFIED")
		domain := strings.TrimSuffix(string(ed.Name()), "ErrorReason")
		for j := range ed.Values().Len() {
			v := ed.Values().Get(j)
			if v.Number() == 0 {
				continue
			}
			e := Entry{Domain: domain, Reason: strings.TrimPrefix(string(v.Name()), prefix), Value: v}
			if opts := v.Options(); opts != nil {
				e.Codes = proto.GetExtension(opts, errorsv1.E_Codes).([]string)
			}
			if _, dup := byReason[e.Reason]; dup {
				panic(fmt.Sprintf("apierror: reason %s is declared twice in errors.proto", e.Reason))
			}
			byReason[e.Reason] = e
			catalogue = append(catalogue, e)
		}
	}
}

// Catalogue returns every reason of the catalogue, in declaration order
// (domain by domain).
func Catalogue() []Entry {
	catalogueOnce.Do(load)
	return slices.Clone(catalogue)
}

// Known reports whether reason is in the catalogue.
func Known(reason string) bool {
	catalogueOnce.Do(load)
	_, ok := byReason[reason]
	return ok
}

// ReasonOf returns the reason an errors.proto enum value declares, e.g.
// ReasonOf(errorsv1.CommonErrorReason_COMMON_ERROR_REASON_FIELD_REQUIRED)
// is "FIELD_REQUIRED".
func ReasonOf(v protoreflect.Enum) string {
	d := v.Descriptor()
	prefix := strings.TrimSuffix(string(d.Values().ByNumber(0).Name()), "UNSPECIFIED")
	return strings.TrimPrefix(string(d.Values().ByNumber(v.Number()).Name()), prefix)
}

// checkReason refuses, in a test binary, a reason the catalogue does not
// declare, so an invented or misspelt reason fails the tests that reach
// it instead of reaching users. Outside tests it lets the error through:
// a refusal with an uncatalogued reason is still better than none.
func checkReason(reason string) {
	if !testing.Testing() || Known(reason) {
		return
	}
	panic(fmt.Sprintf("apierror: reason %q is not in the catalogue; declare it in proto/v0m3/errors/v1/errors.proto (or use the reason that names the same rule) and run make generate", reason))
}
