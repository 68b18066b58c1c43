// Package deadline bounds internal gRPC calls: every unary call a service
// makes to another gets a deadline that is the caller's, or a configured
// bound from now when that is sooner (or the caller set none, as detached
// work does), so one frozen dependency cannot hold a request forever.
package deadline

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc"
)

// DefaultInternalCallTimeout bounds one internal call when no bound is
// configured.
const DefaultInternalCallTimeout = 10 * time.Second

// Exempt are the unary methods that carry their own, longer bound: the
// adapter's Execute (the attempt timeout the orchestrator sets) and
// Discover (a server's discovery, bounded by the adapter).
var Exempt = []string{
	"/v0m3.adapter.v1.AdapterService/Execute",
	"/v0m3.adapter.v1.AdapterService/Discover",
}

// UnaryClientInterceptor bounds each unary call, except those in exempt,
// by bound (DefaultInternalCallTimeout when zero or less). A deadline the
// caller set that is sooner stays.
func UnaryClientInterceptor(bound time.Duration, exempt ...string) grpc.UnaryClientInterceptor {
	if bound <= 0 {
		bound = DefaultInternalCallTimeout
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if slices.Contains(exempt, method) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		ctx, cancel := context.WithTimeout(ctx, bound)
		defer cancel()
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}
