// Package identitytest lets a unit test of one service's handlers name the
// caller of each RPC without tokens or certificates. It stands in for the
// guard only where the guard is not under test; tests that prove
// authentication run the real guard over mutual TLS, with service
// credentials from Credentials. VerifyJWT checks a token the way a relying
// party on a service's JWKS does.
package identitytest

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/v0m3/v0m3/internal/fieldbehavior/fieldbehaviortest"
	"github.com/v0m3/v0m3/internal/identity"
)

// header names the caller of a test RPC as "id;group,group".
const header = "x-test-caller"

// As returns ctx whose RPCs are made as id in groups.
func As(ctx context.Context, id string, groups ...string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, header, id+";"+strings.Join(groups, ","))
}

// ServerOptions returns server options that put the caller As named (or
// def, when a call names none) into each handler's context.
func ServerOptions(def identity.Caller) []grpc.ServerOption {
	with := func(ctx context.Context) context.Context {
		c := def
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get(header); len(v) == 1 {
			id, groups, _ := strings.Cut(v[0], ";")
			c = identity.Caller{ID: id, Kind: identity.KindUser}
			if groups != "" {
				c.Groups = strings.Split(groups, ",")
			}
		}
		return identity.WithCaller(ctx, c)
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return h(with(ctx), req)
		}, fieldbehaviortest.UnaryServer()),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, &stream{ServerStream: ss, ctx: with(ss.Context())})
		}),
	}
}

type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stream) Context() context.Context { return s.ctx }
