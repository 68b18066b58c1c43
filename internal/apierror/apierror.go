// Package apierror builds and reads the gRPC errors every V0M3 service
// returns: a status code, a message a person can act on, and a
// google.rpc.ErrorInfo with a stable reason (and, for bad arguments, a
// google.rpc.BadRequest naming the field).
package apierror

import (
	"fmt"
	"maps"
	"slices"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the ErrorInfo domain of every V0M3 error.
const Domain = "v0m3.dev"

// New returns a status error with an ErrorInfo carrying reason and
// metadata. Metadata values must be safe to show: never secrets. reason
// must be in the catalogue (Known); a test binary panics otherwise.
func New(code codes.Code, reason, msg string, metadata map[string]string) error {
	checkReason(reason)
	st := status.New(code, msg)
	info := &errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: metadata}
	if d, err := st.WithDetails(info); err == nil {
		st = d
	}
	return st.Err()
}

// FieldViolation describes one bad field.
type FieldViolation struct {
	Field       string
	Description string
}

// InvalidArgument returns INVALID_ARGUMENT with an ErrorInfo and a
// BadRequest listing the offending fields.
func InvalidArgument(reason, msg string, violations ...FieldViolation) error {
	checkReason(reason)
	st := status.New(codes.InvalidArgument, msg)
	br := &errdetails.BadRequest{}
	for _, v := range violations {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: v.Field, Description: v.Description})
	}
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: Domain}, br); err == nil {
		st = d
	}
	return st.Err()
}

// Info returns the ErrorInfo of err, or nil.
func Info(err error) *errdetails.ErrorInfo {
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// Reason returns the ErrorInfo reason of err, or "".
func Reason(err error) string {
	if info := Info(err); info != nil {
		return info.GetReason()
	}
	return ""
}

// Fields returns the field names of err's BadRequest violations, sorted.
func Fields(err error) []string {
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	set := map[string]bool{}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				set[v.GetField()] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// Code returns the gRPC code of err (codes.Unknown for non-status errors,
// codes.OK for nil).
func Code(err error) codes.Code { return status.Code(err) }

// Is reports whether err has the given code and reason.
func Is(err error, code codes.Code, reason string) bool {
	return err != nil && status.Code(err) == code && Reason(err) == reason
}

// maxPropagatedMessage bounds the message of a status passed on from
// another service: its text is the other side's, so it is cut rather than
// echoed whole.
const maxPropagatedMessage = 1024

// Propagate returns a status error as the caller should see it, so a
// downstream service's code and details reach the caller: unchanged, but
// for a message over maxPropagatedMessage (cut) and an UNAVAILABLE that
// says neither why nor when to retry (a dependency that could not be
// reached: it gets reason DEPENDENCY_UNAVAILABLE and a RetryInfo, so it
// stays retryable however many hops it crosses). Anything else is
// INTERNAL, its text in the message only cut short.
func Propagate(err error, msg string) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return status.Error(codes.Internal, cut(fmt.Sprintf("%s: %v", msg, err)))
	}
	pb := st.Proto()
	changed := false
	if len(pb.GetMessage()) > maxPropagatedMessage {
		pb.Message, changed = cut(pb.GetMessage()), true
	}
	if st.Code() == codes.Unavailable && RetryDelay(err) == 0 {
		if Info(err) == nil {
			info, _ := anypb.New(&errdetails.ErrorInfo{Reason: ReasonDependencyUnavailable, Domain: Domain})
			pb.Details = append([]*anypb.Any{info}, pb.Details...)
		}
		retry, _ := anypb.New(&errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelay)})
		pb.Details, changed = append(pb.Details, retry), true
	}
	if !changed {
		return err
	}
	return status.FromProto(pb).Err()
}

// cut shortens s to maxPropagatedMessage bytes, marking the cut.
func cut(s string) string {
	if len(s) <= maxPropagatedMessage {
		return s
	}
	return Truncate(s, maxPropagatedMessage) + "… (cut)"
}

// Truncate cuts s to at most n bytes without splitting a UTF-8 sequence:
// the form in which untrusted or caller text may appear in an error or a
// log.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// WithMetadata returns err with kv (key, value pairs) added to its
// ErrorInfo metadata, keeping its code, message and other details; a key
// already set is left as it is. A status error without an ErrorInfo gets
// one with fallbackReason (unchanged when that is ""); nil stays nil.
// Values must be safe to show, as for New.
func WithMetadata(err error, fallbackReason string, kv ...string) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	pb := st.Proto()
	at := -1
	info := &errdetails.ErrorInfo{}
	for i, d := range pb.GetDetails() {
		if d.MessageIs(info) && d.UnmarshalTo(info) == nil {
			at = i
			break
		}
	}
	if at < 0 {
		if fallbackReason == "" {
			return err
		}
		checkReason(fallbackReason)
		info = &errdetails.ErrorInfo{Reason: fallbackReason, Domain: Domain}
	}
	if info.Metadata == nil {
		info.Metadata = map[string]string{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if _, set := info.Metadata[kv[i]]; !set {
			info.Metadata[kv[i]] = kv[i+1]
		}
	}
	a, merr := anypb.New(info)
	if merr != nil {
		return err
	}
	if at < 0 {
		pb.Details = append([]*anypb.Any{a}, pb.Details...)
	} else {
		pb.Details[at] = a
	}
	return status.FromProto(pb).Err()
}
