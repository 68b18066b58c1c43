package attack_test

import (
	"context"
	"io"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/serve"
	_ "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	_ "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	_ "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// serviceOf maps a gRPC service to the V0M3 service that serves it.
var serviceOf = map[string]string{
	"v0m3.registry.v1.RegistryService":         suite.Registry,
	"v0m3.policy.v1.PolicyService":             suite.Policy,
	"v0m3.evidence.v1.EvidenceService":         suite.Evidence,
	"v0m3.adapter.v1.AdapterService":           suite.Adapter,
	"v0m3.orchestrator.v1.OrchestratorService": suite.Orchestrator,
}

type rpc struct {
	full   string
	server string
	md     protoreflect.MethodDescriptor
}

func allRPCs(t *testing.T) []rpc {
	t.Helper()
	var out []rpc
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			server, ok := serviceOf[string(sd.FullName())]
			if !ok {
				continue
			}
			for j := range sd.Methods().Len() {
				md := sd.Methods().Get(j)
				out = append(out, rpc{full: "/" + string(sd.FullName()) + "/" + string(md.Name()), server: server, md: md})
			}
		}
		return true
	})
	if len(out) < 40 {
		t.Fatalf("found %d RPCs; are the protos registered?", len(out))
	}
	return out
}

// call invokes any RPC with an empty request and returns its error.
func call(ctx context.Context, conn *grpc.ClientConn, r rpc) error {
	req := dynamicpb.NewMessage(r.md.Input())
	if !r.md.IsStreamingServer() {
		return conn.Invoke(ctx, r.full, req, dynamicpb.NewMessage(r.md.Output()))
	}
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, r.full)
	if err != nil {
		return err
	}
	if err := st.SendMsg(req); err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	err = st.RecvMsg(dynamicpb.NewMessage(r.md.Output()))
	if err == io.EOF {
		return nil
	}
	return err
}

// TestStrangerIsRefusedEverywhere calls every RPC of every service as
// someone with network reach and no credentials, and as someone with a
// valid token but no certificate calling what only peer services may:
// every call is refused before its handler, and nothing is created.
func TestStrangerIsRefusedEverywhere(t *testing.T) {
	t.Parallel()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	conns := map[string]*grpc.ClientConn{}
	for _, name := range suite.Names {
		c, err := serve.Dial(s.Addr[name], s.CallerDialOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		conns[name] = c
	}
	ctx := context.Background()
	// A valid token of someone in every group: what a token alone cannot
	// buy is a peer service's RPC.
	everyone := s.As(ctx, "mallory", "platform", "reviewers", "approvers", "auditors", "policy-admins", "product-services", "authors", "publishers")
	for _, r := range allRPCs(t) {
		err := call(ctx, conns[r.server], r)
		if c := apierror.Code(err); c != codes.Unauthenticated && c != codes.PermissionDenied {
			t.Errorf("%s without credentials: %v, want UNAUTHENTICATED or PERMISSION_DENIED", r.full, err)
		}
		a, _ := identity.AccessFor(r.full)
		if a.Callers {
			continue
		}
		err = call(everyone, conns[r.server], r)
		if !apierror.Is(err, codes.PermissionDenied, "PEER_NOT_ALLOWED") {
			t.Errorf("%s with a token but no service certificate: %v, want PEER_NOT_ALLOWED", r.full, err)
		}
	}
	// Nothing was created.
	admin := s.As(ctx, "auditor", "platform", "auditors")
	list, err := s.Registry.ListConnections(admin, &registryv1.ListConnectionsRequest{})
	if err != nil || len(list.GetConnections()) != 0 {
		t.Fatalf("connections after the attack: %v, %v", list, err)
	}
	_, err = s.Orchestrator.GetTask(admin, &orchestratorv1.GetTaskRequest{Id: "task_x"})
	if apierror.Code(err) != codes.NotFound {
		t.Fatalf("GetTask: %v", err)
	}
}

// TestPeerOutsideItsRowIsRefused: a real service certificate does not open
// RPCs the table does not give that service, e.g. the adapter asking
// policy for a handle or a budget charge, or the registry asking the
// adapter to execute.
func TestPeerOutsideItsRowIsRefused(t *testing.T) {
	t.Parallel()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := context.Background()
	for _, r := range allRPCs(t) {
		a, _ := identity.AccessFor(r.full)
		for _, peer := range identity.Services {
			if peer == r.server || slices.Contains(a.Peers, peer) {
				continue
			}
			creds, err := s.Credentials(peer)
			if err != nil {
				t.Fatal(err)
			}
			c, err := serve.Dial(s.Addr[r.server], identity.PeerDialOptions(peer, creds, r.server)...)
			if err != nil {
				t.Fatal(err)
			}
			err = call(ctx, c, r)
			_ = c.Close()
			want := "PEER_NOT_ALLOWED"
			if a.Callers {
				want = "CREDENTIALS_MISSING" // a peer not in the row is only a caller, and brought no token
			}
			if apierror.Reason(err) != want {
				t.Errorf("%s as %s: %v, want %s", r.full, peer, err, want)
			}
		}
	}
}
