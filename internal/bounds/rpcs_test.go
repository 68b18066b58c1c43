package bounds_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/bounds"
	"github.com/v0m3/v0m3/services/evidence"
	"github.com/v0m3/v0m3/services/orchestrator"
	"github.com/v0m3/v0m3/services/policy"
	"github.com/v0m3/v0m3/services/registry"
)

// TestEveryRPCBounded: every RPC of every V0M3 service that declares its
// limits, unary or streaming, is refused FIELD_TOO_LONG naming the field
// when a string of its request is over the limit, before its handler
// runs; so an RPC added later cannot be left unbounded. Only the adapter
// bounds its own requests (every one comes from the orchestrator, under a
// signed grant).
func TestEveryRPCBounded(t *testing.T) {
	t.Parallel()
	// Limits reads no state: a nil server answers it.
	declared := map[protoreflect.FullName]bounds.Bounded{
		"v0m3.orchestrator.v1.OrchestratorService": (*orchestrator.Server)(nil),
		"v0m3.registry.v1.RegistryService":         (*registry.Server)(nil),
		"v0m3.policy.v1.PolicyService":             (*policy.Server)(nil),
		"v0m3.evidence.v1.EvidenceService":         (*evidence.Server)(nil),
	}
	selfBounded := []protoreflect.FullName{"v0m3.adapter.v1.AdapterService"}
	var rpcs int
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), "v0m3.") {
			return true
		}
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			srv, ok := declared[sd.FullName()]
			if !ok {
				if !slices.Contains(selfBounded, sd.FullName()) {
					t.Errorf("%s declares no limits (bounds.Bounded) and is not known to bound its own requests", sd.FullName())
				}
				continue
			}
			over := overAll(srv.Limits())
			for j := range sd.Methods().Len() {
				rpcs++
				md := sd.Methods().Get(j)
				t.Run(string(sd.Name())+"/"+string(md.Name()), func(t *testing.T) {
					t.Parallel()
					checkRefused(t, srv, md, over)
				})
			}
		}
		return true
	})
	if rpcs < 40 {
		t.Fatalf("found only %d bounded RPCs; are the protos registered?", rpcs)
	}
}

// checkRefused sends md a request with one string, over, longer than
// every limit of srv, through the interceptor serve.New installs for md's kind, and
// wants it refused before the handler.
func checkRefused(t *testing.T, srv bounds.Bounded, md protoreflect.MethodDescriptor, over string) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
	if err != nil {
		t.Fatal(err)
	}
	req := mt.New()
	field, ok := overLimit(req, over, "")
	if !ok {
		t.Skipf("%s has no string field to bound", md.Input().FullName())
	}
	full := "/" + string(md.Parent().FullName()) + "/" + string(md.Name())
	handled := false
	if md.IsStreamingClient() || md.IsStreamingServer() {
		err = bounds.StreamServer()(srv, &recvStream{req: req.Interface()}, &grpc.StreamServerInfo{FullMethod: full},
			func(_ any, ss grpc.ServerStream) error {
				if err := ss.RecvMsg(mt.New().Interface()); err != nil {
					return err
				}
				handled = true
				return nil
			})
	} else {
		_, err = bounds.UnaryServer()(context.Background(), req.Interface(), &grpc.UnaryServerInfo{Server: srv, FullMethod: full},
			func(context.Context, any) (any, error) { handled = true; return nil, nil })
	}
	if handled || !apierror.Is(err, codes.InvalidArgument, bounds.ReasonFieldTooLong) {
		t.Fatalf("%s with %s over every limit: handled %v, %v; want INVALID_ARGUMENT %s before the handler", full, field, handled, err, bounds.ReasonFieldTooLong)
	}
	if got := apierror.Info(err).GetMetadata()["field"]; got != field {
		t.Errorf("refusal names field %q; want %q", got, field)
	}
}

// overAll is a string longer than any limit l applies to a string.
func overAll(l bounds.Limits) string {
	n := max(bounds.ID, bounds.Name, bounds.Text, l.String)
	for _, limit := range l.Bytes {
		n = max(n, limit)
	}
	return strings.Repeat("x", n+1)
}

// overLimit sets the first singular string field of m (depth first) to
// s and returns its path.
func overLimit(m protoreflect.Message, s, prefix string) (string, bool) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsList() || fd.IsMap() {
			continue
		}
		path := prefix + string(fd.Name())
		switch fd.Kind() {
		case protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString(s))
			return path, true
		case protoreflect.MessageKind:
			if strings.HasPrefix(string(fd.Message().FullName()), "google.protobuf.") {
				continue
			}
			if p, ok := overLimit(m.Mutable(fd).Message(), s, path+"."); ok {
				return p, true
			}
			m.Clear(fd)
		}
	}
	return "", false
}

// recvStream is a server stream whose one message is req.
type recvStream struct {
	grpc.ServerStream
	req proto.Message
}

func (s *recvStream) RecvMsg(m any) error {
	proto.Merge(m.(proto.Message), s.req)
	return nil
}
