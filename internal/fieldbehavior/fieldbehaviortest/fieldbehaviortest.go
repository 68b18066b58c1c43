// Package fieldbehaviortest checks the REQUIRED annotations against the
// handlers, in the services' own tests: a server's tests run without
// fieldbehavior's refusal (they see the handlers' own), and every request
// a handler accepts must be one the annotations accept too, or the
// annotation is wrong (a field marked REQUIRED that a valid request
// leaves out).
package fieldbehaviortest

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/fieldbehavior"
)

// UnaryServer runs the handler and, when it accepts a request that
// fieldbehavior.Check refuses, fails the call with INTERNAL naming the
// method and the fields, so the test that sent that valid request fails.
func UnaryServer() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			return resp, err
		}
		if m, ok := req.(proto.Message); ok {
			if cerr := fieldbehavior.Check(m); cerr != nil {
				return nil, status.Errorf(codes.Internal, "fieldbehaviortest: %s accepted a request its REQUIRED annotations refuse (%v): the annotation is wrong", info.FullMethod, cerr)
			}
		}
		return resp, nil
	}
}
