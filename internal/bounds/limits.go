package bounds

import (
	"context"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/v0m3/v0m3/internal/apierror"
)

// Limits are the bounds of one service's requests, declared once and
// applied by Check to every populated field of a request, however deeply
// nested, so that a field added later is bounded too. A field is looked
// up by its proto name (the last element of its path).
type Limits struct {
	// Bytes maps a field name to its limit in bytes: of a string or bytes
	// field, of each string of a list, of each value of a map, or of a
	// structured value's encoding.
	Bytes map[string]int
	// Entries maps a list or map field's name to its most entries.
	Entries map[string]int
	// String is the limit of a string field Bytes does not name, unless
	// its name marks an identifier (id, *_id, *_ids, digest, *_digest),
	// which is bounded by ID.
	String int
	// List is the most entries of a list or map Entries does not name.
	List int
}

// structured are the message types bounded whole, by their encoded size,
// rather than field by field: their keys and values are the caller's
// data (schemas, arguments).
var structured = map[protoreflect.FullName]bool{
	"google.protobuf.Struct": true, "google.protobuf.Value": true,
	"google.protobuf.ListValue": true, "google.protobuf.Any": true,
}

// Check refuses the first field of m over its limit: FieldTooLong for a
// value, TooMany (TOO_MANY_ENTRIES, or SCOPE_TOO_LARGE for a *_scope
// field) for a list or map. The error names the field's path, e.g.
// "snapshot.tools[3].description", never its value.
func (l Limits) Check(m proto.Message) error {
	if m == nil {
		return nil
	}
	var p path
	return l.message(m.ProtoReflect(), &p)
}

// path is where the walk is in a request. It is formatted only when a
// value is refused, so a request within its bounds (nearly every one) is
// checked without building a string per field.
type path []step

// step is one element of a path: a field (name), a list element (index)
// or a map value (key), or the map key itself (isKey).
type step struct {
	name  string
	index int
	key   string
	kind  stepKind
}

type stepKind uint8

const (
	stepField stepKind = iota
	stepIndex
	stepMapValue
	stepMapKey
)

func (p *path) push(st step) { *p = append(*p, st) }
func (p *path) pop()         { *p = (*p)[:len(*p)-1] }

// String formats p as errors name fields: "a.b[3].c", `m["k"]`, "m key".
func (p path) String() string {
	var b strings.Builder
	for i, st := range p {
		switch st.kind {
		case stepField:
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(st.name)
		case stepIndex:
			b.WriteString("[" + strconv.Itoa(st.index) + "]")
		case stepMapValue:
			b.WriteString("[" + strconv.Quote(apierror.Truncate(st.key, 32)) + "]")
		case stepMapKey:
			b.WriteString(" key")
		}
	}
	return b.String()
}

func (l Limits) message(m protoreflect.Message, p *path) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p.push(step{name: string(fd.Name())})
		err = l.field(fd, v, p)
		p.pop()
		return err == nil
	})
	return err
}

func (l Limits) field(fd protoreflect.FieldDescriptor, v protoreflect.Value, p *path) error {
	name := string(fd.Name())
	switch {
	case fd.IsList():
		list := v.List()
		if limit := l.entries(name); list.Len() > limit {
			return TooMany(listReason(name), p.String(), list.Len(), limit)
		}
		for i := range list.Len() {
			p.push(step{index: i, kind: stepIndex})
			err := l.value(fd, name, list.Get(i), p)
			p.pop()
			if err != nil {
				return err
			}
		}
	case fd.IsMap():
		mp := v.Map()
		if limit := l.entries(name); mp.Len() > limit {
			return TooMany(listReason(name), p.String(), mp.Len(), limit)
		}
		var err error
		mp.Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			key := k.String()
			if len(key) > Name {
				p.push(step{kind: stepMapKey})
				err = FieldTooLong(p.String(), Name)
				p.pop()
				return false
			}
			p.push(step{key: key, kind: stepMapValue})
			err = l.value(fd.MapValue(), name, mv, p)
			p.pop()
			return err == nil
		})
		return err
	default:
		return l.value(fd, name, v, p)
	}
	return nil
}

// value bounds one value of fd (a field, a list element or a map value),
// under the limits of the field named name (for a map value, the map's).
func (l Limits) value(fd protoreflect.FieldDescriptor, name string, v protoreflect.Value, p *path) error {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if limit := l.bytes(name); len(v.String()) > limit {
			return FieldTooLong(p.String(), limit)
		}
	case protoreflect.BytesKind:
		if limit := l.bytes(name); len(v.Bytes()) > limit {
			return FieldTooLong(p.String(), limit)
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		msg := v.Message()
		if structured[msg.Descriptor().FullName()] {
			limit, ok := l.Bytes[name]
			if !ok {
				limit = Structured
			}
			if size := proto.Size(msg.Interface()); size > limit {
				return FieldTooLong(p.String(), limit)
			}
			return nil
		}
		return l.message(msg, p)
	}
	return nil
}

// bytes is the byte limit of a field named name.
func (l Limits) bytes(name string) int {
	if limit, ok := l.Bytes[name]; ok {
		return limit
	}
	if identifier(name) {
		return ID
	}
	if l.String > 0 {
		return l.String
	}
	return Text
}

// entries is the entry limit of a list or map named name.
func (l Limits) entries(name string) int {
	if limit, ok := l.Entries[name]; ok {
		return limit
	}
	if l.List > 0 {
		return l.List
	}
	return Entries
}

// identifier reports whether a field's name marks an identifier, a digest
// or a list of identifiers.
func identifier(name string) bool {
	return name == "id" || name == "digest" || strings.HasSuffix(name, "_id") || strings.HasSuffix(name, "_ids") ||
		strings.HasSuffix(name, "_digest")
}

// listReason is the reason of a list or map over its limit.
func listReason(name string) string {
	if strings.HasSuffix(name, "_scope") {
		return ReasonScopeTooLarge
	}
	return ReasonTooManyEntries
}

// Bounded is implemented by a service whose requests are bounded by
// declared Limits.
type Bounded interface {
	// Limits are the bounds of the service's requests.
	Limits() Limits
}

// UnaryServer refuses a request over its service's Limits before the
// handler (or anything after this interceptor: audit, logs) sees it. A
// service that does not implement Bounded bounds its own requests.
func UnaryServer() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if b, ok := info.Server.(Bounded); ok {
			if m, ok := req.(proto.Message); ok {
				if err := b.Limits().Check(m); err != nil {
					return nil, err
				}
			}
		}
		return handler(ctx, req)
	}
}

// StreamServer refuses each message a stream receives over its service's
// Limits, as UnaryServer does a unary request: the handler of a
// server-streaming RPC gets an error instead of its request.
func StreamServer() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if b, ok := srv.(Bounded); ok {
			ss = &boundedStream{ServerStream: ss, limits: b.Limits()}
		}
		return handler(srv, ss)
	}
}

// boundedStream checks each message it receives against limits.
type boundedStream struct {
	grpc.ServerStream
	limits Limits
}

func (s *boundedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if pm, ok := m.(proto.Message); ok {
		return s.limits.Check(pm)
	}
	return nil
}
