// Package bounds is the one place for the limits of what a caller may send
// a V0M3 service and for the error a request over them gets: INVALID_ARGUMENT
// with reason FIELD_TOO_LONG (or TOO_MANY_ENTRIES, SCOPE_TOO_LARGE for a
// list), naming the field and the limit in the ErrorInfo metadata and never
// quoting the oversized value. A request over a bound is refused before
// anything reads, logs or records it.
//
// Services bound their requests either field by field (Check) or whole,
// by declared Limits walked over every string, bytes, list and map field
// of the request (Limits.Check, and UnaryServer and StreamServer for a
// server whose implementation declares its Limits).
package bounds

import (
	"fmt"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
)

// Limits every service shares. Ids and names are short; free text is
// bounded so that what repeats it (errors, logs, traces, approval pages)
// stays small.
const (
	// ID bounds an identifier, a digest or a key.
	ID = 256
	// Name bounds a name: of a capability, tool, profile, group, field.
	Name = 256
	// URI bounds a URI, a path or a command.
	URI = 4096
	// Text bounds free text a person writes: a reason, a note, a detail.
	Text = 4096
	// Long bounds longer text a server or an integrator supplies: a
	// description, a passage, an icon given as a data URI.
	Long = 64 << 10
	// Entries bounds the entries of a list or map.
	Entries = 1000
	// Structured bounds a structured value (a schema, arguments) by its
	// encoded size.
	Structured = 1 << 20
	// Echo bounds caller text quoted back in an error message.
	Echo = 128
	// EchoedNames bounds how many caller-chosen names an error lists.
	EchoedNames = 10
)

// Reasons of a request over a bound.
const (
	// ReasonFieldTooLong refuses a string, bytes or structured value over
	// its limit in bytes.
	ReasonFieldTooLong = "FIELD_TOO_LONG"
	// ReasonTooManyEntries refuses a list or map with more entries than
	// its limit.
	ReasonTooManyEntries = "TOO_MANY_ENTRIES"
	// ReasonScopeTooLarge refuses a task scope with more entries than its
	// limit.
	ReasonScopeTooLarge = "SCOPE_TOO_LARGE"
)

// Units of a limit, as the error's metadata names them.
const (
	unitBytes   = "bytes"
	unitEntries = "entries"
)

// Bound is one field's size beside its limit in bytes.
type Bound struct {
	Field string
	Size  int
	Limit int
}

// Bytes is the bound of a string field.
func Bytes(field, value string, limit int) Bound { return Bound{field, len(value), limit} }

// Check refuses the first of bs over its limit (FieldTooLong).
func Check(bs ...Bound) error {
	for _, b := range bs {
		if b.Size > b.Limit {
			return FieldTooLong(b.Field, b.Limit)
		}
	}
	return nil
}

// FieldTooLong is the error of a field over its limit in bytes:
// INVALID_ARGUMENT FIELD_TOO_LONG, with the field and the limit in the
// ErrorInfo metadata and a BadRequest violation. The value is never
// quoted.
func FieldTooLong(field string, limit int) error {
	return refuse(ReasonFieldTooLong, field, limit, unitBytes,
		fmt.Sprintf("%s is longer than %d bytes", field, limit))
}

// TooMany is the error of a list or map of field with n entries, more than
// limit, under reason (ReasonTooManyEntries, ReasonScopeTooLarge).
func TooMany(reason, field string, n, limit int) error {
	return refuse(reason, field, limit, unitEntries,
		fmt.Sprintf("%s lists %d entries, more than %d", field, n, limit))
}

// refuse builds INVALID_ARGUMENT with an ErrorInfo whose metadata names
// the field, the limit and its unit, and a BadRequest for the field.
func refuse(reason, field string, limit int, unit, msg string) error {
	st := status.New(codes.InvalidArgument, msg)
	info := &errdetails.ErrorInfo{Reason: reason, Domain: apierror.Domain, Metadata: map[string]string{
		"field": field, "limit": strconv.Itoa(limit), "unit": unit,
	}}
	br := &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
		Field: field, Description: fmt.Sprintf("at most %d %s", limit, unit),
	}}}
	if d, err := st.WithDetails(info, br); err == nil {
		st = d
	}
	return st.Err()
}

// Names returns caller-chosen names as an error may quote them: at most
// EchoedNames, each cut to Echo bytes, and how many were left out.
func Names(names []string) (shown []string, more int) {
	if len(names) > EchoedNames {
		names, more = names[:EchoedNames], len(names)-EchoedNames
	}
	shown = make([]string, len(names))
	for i, n := range names {
		shown[i] = apierror.Truncate(n, Echo)
	}
	return shown, more
}
