// Package fieldbehavior enforces the google.api.field_behavior annotations
// (AIP-203) of V0M3's contracts, so that the .proto file is the one place
// a field is declared required: a request missing a REQUIRED field (at any
// depth of a sub-message it does set) is refused INVALID_ARGUMENT, reason
// FIELD_REQUIRED, with a google.rpc.BadRequest naming each missing field's
// path, before its handler runs. Requirements that depend on other fields
// or on the caller stay in the handlers; a field is annotated REQUIRED only
// when every valid request sets it. OUTPUT_ONLY fields of a request are
// cleared before its handler runs, as AIP-203 has a server ignore them.
package fieldbehavior

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/v0m3/v0m3/internal/apierror"
)

// UnaryServer clears a unary request's OUTPUT_ONLY fields and refuses it
// if it misses a REQUIRED field, before the handler runs.
func UnaryServer() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if m, ok := req.(proto.Message); ok {
			ClearOutputOnly(m)
			if err := Check(m); err != nil {
				return nil, err
			}
		}
		return handler(ctx, req)
	}
}

// StreamServer clears and checks each message a stream receives, as
// UnaryServer does a unary request: a server-streaming
// RPC's implementation is never called, its generated handler gets the
// error instead of the request.
func StreamServer() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &checkedStream{ServerStream: ss})
	}
}

// checkedStream checks each message it receives.
type checkedStream struct {
	grpc.ServerStream
}

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if pm, ok := m.(proto.Message); ok {
		ClearOutputOnly(pm)
		return Check(pm)
	}
	return nil
}

// Check returns the FIELD_REQUIRED refusal of m if it misses a REQUIRED
// field: one of its own, or one of a sub-message it sets (a singular
// message field, each element of a list, each value of a map). A member
// of a oneof is never required itself (which member is set is the oneof's
// choice), though the sub-message of a set member is checked. For a field without presence (a proto3 scalar, a list, a map)
// missing means its zero value or no entries. Nil when nothing is missing.
// The refusal's ErrorInfo metadata "field" names the first missing field's
// path; its BadRequest lists every one.
func Check(m proto.Message) error {
	var missing []string
	walk(m.ProtoReflect(), "", &missing)
	if len(missing) == 0 {
		return nil
	}
	v := make([]apierror.FieldViolation, len(missing))
	for i, f := range missing {
		v[i] = apierror.FieldViolation{Field: f, Description: f + " is required"}
	}
	msg := listed(missing) + " is required"
	if len(missing) > 1 {
		msg = listed(missing) + " are required"
	}
	return apierror.WithMetadata(apierror.InvalidArgument(apierror.ReasonFieldRequired, msg, v...), "", "field", missing[0])
}

// listed joins names as a person would: "a", "a and b", "a, b and c".
func listed(names []string) string {
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// walk appends to missing the path of each REQUIRED field m lacks, then
// walks the set sub-messages that can hold one.
func walk(m protoreflect.Message, prefix string, missing *[]string) {
	p := planFor(m.Descriptor())
	for _, fd := range p.required {
		if !m.Has(fd) {
			*missing = append(*missing, prefix+string(fd.Name()))
		}
	}
	for _, fd := range p.nested {
		if !m.Has(fd) {
			continue
		}
		path := prefix + string(fd.Name())
		switch {
		case fd.IsList():
			l := m.Get(fd).List()
			for i := range l.Len() {
				walk(l.Get(i).Message(), fmt.Sprintf("%s[%d].", path, i), missing)
			}
		case fd.IsMap():
			mp := m.Get(fd).Map()
			keys := make([]protoreflect.MapKey, 0, mp.Len())
			mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
				keys = append(keys, k)
				return true
			})
			// Map order is random; the refusal names fields in a stable order.
			slices.SortFunc(keys, func(a, b protoreflect.MapKey) int { return strings.Compare(a.String(), b.String()) })
			for _, k := range keys {
				walk(mp.Get(k).Message(), fmt.Sprintf("%s[%q].", path, k.String()), missing)
			}
		default:
			walk(m.Get(fd).Message(), path+".", missing)
		}
	}
}

// plan is what Check looks at in one message type: its REQUIRED fields and
// the message-typed fields through which a REQUIRED field can be reached.
type plan struct {
	required []protoreflect.FieldDescriptor
	nested   []protoreflect.FieldDescriptor
}

// plans caches a plan per message type: the descriptors are fixed, so a
// request pays for reading annotations only the first time its type is
// seen, and a request type with nothing required anywhere costs a map load.
var plans sync.Map // protoreflect.FullName → *plan

func planFor(md protoreflect.MessageDescriptor) *plan {
	if p, ok := plans.Load(md.FullName()); ok {
		return p.(*plan)
	}
	p := &plan{}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if IsRequired(fd) && !inOneof(fd) {
			p.required = append(p.required, fd)
		}
		if sub := messageOf(fd); sub != nil && reachesRequired(sub, map[protoreflect.FullName]bool{}) {
			p.nested = append(p.nested, fd)
		}
	}
	plans.Store(md.FullName(), p)
	return p
}

// inOneof reports whether fd is a member of a real oneof (not the one
// proto3 makes for an optional field).
func inOneof(fd protoreflect.FieldDescriptor) bool {
	o := fd.ContainingOneof()
	return o != nil && !o.IsSynthetic()
}

// messageOf is the message type of fd's values (a map's values), or nil.
func messageOf(fd protoreflect.FieldDescriptor) protoreflect.MessageDescriptor {
	if fd.IsMap() {
		fd = fd.MapValue()
	}
	if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
		return fd.Message()
	}
	return nil
}

// reachesRequired reports whether md, or a message type reachable from it
// through its fields, has a REQUIRED field Check would look at. seen stops
// recursive types (google.protobuf.Struct, for one).
func reachesRequired(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if IsRequired(fd) && !inOneof(fd) {
			return true
		}
		if sub := messageOf(fd); sub != nil && reachesRequired(sub, seen) {
			return true
		}
	}
	return false
}

// Behaviors returns fd's google.api.field_behavior annotations.
func Behaviors(fd protoreflect.FieldDescriptor) []annotations.FieldBehavior {
	opts := fd.Options()
	if opts == nil || !proto.HasExtension(opts, annotations.E_FieldBehavior) {
		return nil
	}
	b, _ := proto.GetExtension(opts, annotations.E_FieldBehavior).([]annotations.FieldBehavior)
	return b
}

// IsRequired reports whether fd is annotated REQUIRED.
func IsRequired(fd protoreflect.FieldDescriptor) bool {
	return slices.Contains(Behaviors(fd), annotations.FieldBehavior_REQUIRED)
}

// IsOutputOnly reports whether fd is annotated OUTPUT_ONLY.
func IsOutputOnly(fd protoreflect.FieldDescriptor) bool {
	return slices.Contains(Behaviors(fd), annotations.FieldBehavior_OUTPUT_ONLY)
}

// ClearOutputOnly clears every OUTPUT_ONLY field of m and of the
// sub-messages it sets: AIP-203 has a server ignore them in a request
// (never refuse one for them), and cleared they cannot reach a handler
// that forgot to.
func ClearOutputOnly(m proto.Message) {
	clearOut(m.ProtoReflect())
}

func clearOut(m protoreflect.Message) {
	p := outPlanFor(m.Descriptor())
	for _, fd := range p.output {
		m.Clear(fd)
	}
	for _, fd := range p.nested {
		if !m.Has(fd) {
			continue
		}
		switch {
		case fd.IsList():
			l := m.Get(fd).List()
			for i := range l.Len() {
				clearOut(l.Get(i).Message())
			}
		case fd.IsMap():
			m.Get(fd).Map().Range(func(_ protoreflect.MapKey, v protoreflect.Value) bool {
				clearOut(v.Message())
				return true
			})
		default:
			clearOut(m.Get(fd).Message())
		}
	}
}

// outPlans caches, per message type, its OUTPUT_ONLY fields and the
// message-typed fields through which one is reached, as plans does for
// REQUIRED ones.
var outPlans sync.Map // protoreflect.FullName → *outPlan

type outPlan struct {
	output []protoreflect.FieldDescriptor
	nested []protoreflect.FieldDescriptor
}

func outPlanFor(md protoreflect.MessageDescriptor) *outPlan {
	if p, ok := outPlans.Load(md.FullName()); ok {
		return p.(*outPlan)
	}
	p := &outPlan{}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if IsOutputOnly(fd) {
			p.output = append(p.output, fd)
			continue
		}
		if sub := messageOf(fd); sub != nil && reaches(sub, IsOutputOnly, map[protoreflect.FullName]bool{}) {
			p.nested = append(p.nested, fd)
		}
	}
	outPlans.Store(md.FullName(), p)
	return p
}

// reaches reports whether md, or a message type reachable from it through
// its fields, has a field for which has is true.
func reaches(md protoreflect.MessageDescriptor, has func(protoreflect.FieldDescriptor) bool, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if has(fd) {
			return true
		}
		if sub := messageOf(fd); sub != nil && reaches(sub, has, seen) {
			return true
		}
	}
	return false
}
