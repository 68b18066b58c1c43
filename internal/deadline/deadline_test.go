package deadline

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"
)

// frozen serves every method by waiting until the caller gives up: a
// dependency that accepted the call and never answers.
func frozen(t *testing.T, bound time.Duration) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 16)
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		<-stream.Context().Done()
		return status.FromContextError(stream.Context().Err()).Err()
	}))
	go func() { _ = srv.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///frozen",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(UnaryClientInterceptor(bound, Exempt...)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		srv.Stop()
	})
	return cc
}

// A call to a frozen dependency ends at the configured bound when the
// caller set no deadline (detached work) or a later one, and at the
// caller's when it is sooner; the adapter's Execute is left to the
// caller's own bound.
func TestInternalCallsAreBounded(t *testing.T) {
	t.Parallel()
	const bound = time.Second
	for _, tc := range []struct {
		name     string
		method   string
		caller   time.Duration // 0: no deadline
		atLeast  time.Duration
		atMost   time.Duration
		wantCode codes.Code
	}{
		{"no caller deadline", "/v0m3.evidence.v1.EvidenceService/AppendTraces", 0, bound, 20 * time.Second, codes.DeadlineExceeded},
		{"a later caller deadline", "/v0m3.registry.v1.RegistryService/GetMapping", time.Hour, bound, 20 * time.Second, codes.DeadlineExceeded},
		{"a sooner caller deadline", "/v0m3.policy.v1.PolicyService/Charge", 50 * time.Millisecond, 50 * time.Millisecond, bound, codes.DeadlineExceeded},
		{"execute keeps the caller's", "/v0m3.adapter.v1.AdapterService/Execute", 3 * bound, 3 * bound, 20 * time.Second, codes.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cc := frozen(t, bound)
			ctx := t.Context()
			// Taken before the caller's deadline is set, so the deadline
			// is never earlier than start+caller.
			start := time.Now()
			if tc.caller > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.caller)
				defer cancel()
			}
			err := cc.Invoke(ctx, tc.method, &emptypb.Empty{}, &emptypb.Empty{})
			took := time.Since(start)
			if status.Code(err) != tc.wantCode {
				t.Fatalf("error = %v, want %s", err, tc.wantCode)
			}
			if took < tc.atLeast || took > tc.atMost {
				t.Errorf("the call ended after %v, want between %v and %v", took, tc.atLeast, tc.atMost)
			}
		})
	}
}
