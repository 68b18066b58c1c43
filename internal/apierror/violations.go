package apierror

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
)

// WithFieldViolations returns err with a google.rpc.BadRequest naming the
// fields that caused it, keeping its code, message and other details: a
// refusal other than INVALID_ARGUMENT (say PERMISSION_DENIED for one entry
// of a list) can then point at the entry, as Fields reads it. A non-status
// err is returned as it is.
func WithFieldViolations(err error, violations ...FieldViolation) error {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return err
	}
	br := &errdetails.BadRequest{}
	for _, v := range violations {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: v.Field, Description: v.Description})
	}
	if d, derr := st.WithDetails(br); derr == nil {
		return d.Err()
	}
	return err
}
