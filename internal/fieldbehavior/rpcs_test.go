package fieldbehavior_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/fieldbehavior"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/serve"
	_ "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	_ "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	_ "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	_ "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	_ "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestEveryRPCRefusesAMissingRequiredField: for every RPC of every V0M3
// service, a request with every REQUIRED field set (and the sub-messages
// that hold REQUIRED fields) reaches the handler, and the same request
// without any one of them is refused INVALID_ARGUMENT FIELD_REQUIRED naming
// that field's path, and the handler is not reached. The server is the one
// serve.New builds (the chain every service runs), with a recording
// handler registered for each service's descriptor; so an RPC or a
// REQUIRED field added later is covered without touching this test.
func TestEveryRPCRefusesAMissingRequiredField(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	srv := serve.New("fieldbehavior-test", slog.New(slog.DiscardHandler),
		&identity.Guard{Log: slog.New(slog.DiscardHandler), Authn: anyToken{}})
	var services []protoreflect.ServiceDescriptor
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if strings.HasPrefix(string(fd.Package()), "v0m3.") {
			for i := range fd.Services().Len() {
				services = append(services, fd.Services().Get(i))
			}
		}
		return true
	})
	if len(services) < 5 {
		t.Fatalf("found %d V0M3 services; are the protos registered?", len(services))
	}
	for _, sd := range services {
		srv.GRPC.RegisterService(recordingService(t, sd, rec), rec)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	conn, err := serve.Dial(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	var rpcs, required int
	for _, sd := range services {
		for j := range sd.Methods().Len() {
			md := sd.Methods().Get(j)
			rpcs++
			full := "/" + string(sd.FullName()) + "/" + string(md.Name())
			full1 := newMessage(t, md.Input())
			paths := fill(full1.ProtoReflect(), "")
			required += len(paths)
			t.Run(string(sd.Name())+"/"+string(md.Name()), func(t *testing.T) {
				cctx := callContext(t, full)
				if err := call(cctx, conn, md, full, full1); err != nil {
					t.Fatalf("%s with every REQUIRED field set: %v; want it to reach the handler", full, err)
				}
				if !rec.took(full) {
					t.Fatalf("%s with every REQUIRED field set did not reach the handler", full)
				}
				for _, p := range paths {
					req := proto.Clone(full1)
					clearPath(t, req.ProtoReflect(), p)
					err := call(cctx, conn, md, full, req)
					if !apierror.Is(err, codes.InvalidArgument, apierror.ReasonFieldRequired) {
						t.Errorf("%s without %s: %v; want INVALID_ARGUMENT %s", full, p, err, apierror.ReasonFieldRequired)
						continue
					}
					if got := apierror.Fields(err); !slices.Equal(got, []string{p}) {
						t.Errorf("%s without %s: the BadRequest names %v; want [%s]", full, p, got, p)
					}
					if got := apierror.Info(err).GetMetadata()["field"]; got != p {
						t.Errorf("%s without %s: ErrorInfo metadata field %q; want %q", full, p, got, p)
					}
					if rec.took(full) {
						t.Errorf("%s without %s reached the handler", full, p)
					}
				}
			})
		}
	}
	// The contracts annotate well over a hundred fields; a count far
	// below that means the annotations are not being read.
	if rpcs < 70 || required < 100 {
		t.Errorf("checked %d RPCs and %d REQUIRED fields; are the annotations registered?", rpcs, required)
	}
}

// anyToken admits any bearer token as one end user: what a caller may do
// is not this test's question, only that the request is checked once
// admitted.
type anyToken struct{}

func (anyToken) Authenticate(context.Context, string) (identity.Caller, error) {
	return identity.Caller{ID: "alice", Groups: []string{"authors"}}, nil
}

// callContext admits the call as a peer service the access table lets
// call it (plaintext development mode names the peer in a header), or
// else as a bearer caller.
func callContext(t *testing.T, full string) context.Context {
	a, ok := identity.AccessFor(full)
	if !ok {
		t.Fatalf("%s is not in the access table", full)
	}
	if len(a.Peers) > 0 {
		return metadata.AppendToOutgoingContext(t.Context(), identity.InsecurePeerHeader, a.Peers[0])
	}
	return metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer t")
}

// call sends req to md over conn: unary, or as a stream's one message,
// reading its first response.
func call(ctx context.Context, conn *grpc.ClientConn, md protoreflect.MethodDescriptor, full string, req proto.Message) error {
	out, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		return err
	}
	if !md.IsStreamingClient() && !md.IsStreamingServer() {
		return conn.Invoke(ctx, full, req, out.New().Interface())
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: md.IsStreamingServer(), ClientStreams: md.IsStreamingClient()}, full)
	if err != nil {
		return err
	}
	if err := st.SendMsg(req); err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	return st.RecvMsg(out.New().Interface())
}

// recorder remembers which methods' handlers ran.
type recorder struct {
	mu   sync.Mutex
	seen map[string]int
	read map[string]int
}

func (r *recorder) called(full string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[string]int{}
	}
	r.seen[full]++
}

// took reports whether full's handler ran since the last look.
func (r *recorder) took(full string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.read == nil {
		r.read = map[string]int{}
	}
	n := r.seen[full] - r.read[full]
	r.read[full] = r.seen[full]
	return n > 0
}

// recordingService is a gRPC service with sd's methods whose handlers
// decode the request into its generated type (so the annotations are the
// contract's), record the call and answer an empty response.
func recordingService(t *testing.T, sd protoreflect.ServiceDescriptor, rec *recorder) *grpc.ServiceDesc {
	desc := &grpc.ServiceDesc{ServiceName: string(sd.FullName()), HandlerType: (*any)(nil)}
	for j := range sd.Methods().Len() {
		md := sd.Methods().Get(j)
		full := "/" + string(sd.FullName()) + "/" + string(md.Name())
		in, out := messageType(t, md.Input()), messageType(t, md.Output())
		if md.IsStreamingClient() || md.IsStreamingServer() {
			desc.Streams = append(desc.Streams, grpc.StreamDesc{
				StreamName: string(md.Name()), ServerStreams: md.IsStreamingServer(), ClientStreams: md.IsStreamingClient(),
				Handler: func(_ any, ss grpc.ServerStream) error {
					if err := ss.RecvMsg(in.New().Interface()); err != nil {
						return err
					}
					rec.called(full)
					return ss.SendMsg(out.New().Interface())
				},
			})
			continue
		}
		desc.Methods = append(desc.Methods, grpc.MethodDesc{
			MethodName: string(md.Name()),
			Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
				req := in.New().Interface()
				if err := dec(req); err != nil {
					return nil, err
				}
				h := func(context.Context, any) (any, error) {
					rec.called(full)
					return out.New().Interface(), nil
				}
				if icpt == nil {
					return h(ctx, req)
				}
				return icpt(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, h)
			},
		})
	}
	return desc
}

func messageType(t *testing.T, md protoreflect.MessageDescriptor) protoreflect.MessageType {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
	if err != nil {
		t.Fatal(err)
	}
	return mt
}

func newMessage(t *testing.T, md protoreflect.MessageDescriptor) proto.Message {
	return messageType(t, md).New().Interface()
}

// fill sets, in m, every REQUIRED field and every sub-message through
// which one is reached (one element of a list, one entry of a map, the
// first such member of a oneof), and returns the paths of the REQUIRED
// fields it set, as the refusal names them.
func fill(m protoreflect.Message, prefix string) []string {
	var paths []string
	fields := m.Descriptor().Fields()
	oneofSet := map[protoreflect.FullName]bool{}
	for i := range fields.Len() {
		fd := fields.Get(i)
		o := fd.ContainingOneof()
		inOneof := o != nil && !o.IsSynthetic()
		req := fieldbehavior.IsRequired(fd) && !inOneof
		sub := subMessage(fd)
		reaches := sub != nil && reachesRequired(sub, map[protoreflect.FullName]bool{})
		if !req && !reaches {
			continue
		}
		if inOneof {
			if oneofSet[o.FullName()] {
				continue
			}
			oneofSet[o.FullName()] = true
		}
		path := prefix + string(fd.Name())
		if req {
			paths = append(paths, path)
		}
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			if sub != nil {
				e := l.NewElement()
				paths = append(paths, fill(e.Message(), path+"[0].")...)
				l.Append(e)
			} else {
				l.Append(scalar(fd))
			}
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			k := mapKey(fd.MapKey())
			if sub != nil {
				v := mp.NewValue()
				paths = append(paths, fill(v.Message(), fmt.Sprintf("%s[%q].", path, k.String()))...)
				mp.Set(k, v)
			} else {
				mp.Set(k, scalar(fd.MapValue()))
			}
		case sub != nil:
			paths = append(paths, fill(m.Mutable(fd).Message(), path+".")...)
		default:
			m.Set(fd, scalar(fd))
		}
	}
	return paths
}

func subMessage(fd protoreflect.FieldDescriptor) protoreflect.MessageDescriptor {
	if fd.IsMap() {
		fd = fd.MapValue()
	}
	if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
		return fd.Message()
	}
	return nil
}

func reachesRequired(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	for i := range md.Fields().Len() {
		fd := md.Fields().Get(i)
		if o := fd.ContainingOneof(); fieldbehavior.IsRequired(fd) && (o == nil || o.IsSynthetic()) {
			return true
		}
		if sub := subMessage(fd); sub != nil && reachesRequired(sub, seen) {
			return true
		}
	}
	return false
}

// scalar is a set (non-zero) value of fd's kind.
func scalar(fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("x")
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte("x"))
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(fd.Enum().Values().Get(fd.Enum().Values().Len() - 1).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(1)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(1)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(1)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(1)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(1)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(1)
	}
	panic("no scalar for " + fd.Kind().String())
}

func mapKey(fd protoreflect.FieldDescriptor) protoreflect.MapKey {
	return scalar(fd).MapKey()
}

// clearPath clears the field at path ("a.b", "a[0].b", `a["x"].b`) in m.
func clearPath(t *testing.T, m protoreflect.Message, path string) {
	t.Helper()
	head, rest, nested := strings.Cut(path, ".")
	name, index, indexed := strings.Cut(head, "[")
	fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
	if fd == nil {
		t.Fatalf("no field %s in %s", name, m.Descriptor().FullName())
	}
	if !nested {
		m.Clear(fd)
		return
	}
	switch {
	case indexed && fd.IsList():
		clearPath(t, m.Mutable(fd).List().Get(0).Message(), rest)
	case indexed && fd.IsMap():
		_ = index
		m.Mutable(fd).Map().Range(func(_ protoreflect.MapKey, v protoreflect.Value) bool {
			clearPath(t, v.Message(), rest)
			return false
		})
	default:
		clearPath(t, m.Mutable(fd).Message(), rest)
	}
}
