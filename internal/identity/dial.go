package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// PeerDialOptions are the dial options of service self calling the peer
// service peer: mutual TLS accepting only peer's certificate, or, without
// credentials (plaintext development mode), the self-declared peer header.
func PeerDialOptions(self string, creds *Credentials, peer string) []grpc.DialOption {
	if creds != nil {
		return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(creds.ClientTLS(peer)))}
	}
	name := func(ctx context.Context) context.Context {
		return metadata.AppendToOutgoingContext(ctx, InsecurePeerHeader, self)
	}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(name(ctx), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(name(ctx), desc, cc, method, opts...)
		}),
	}
}

// CallerDialOptions are the dial options of a product or admin caller:
// server-authenticated TLS trusting roots (nil roots: plaintext, for a
// server started with --insecure-plaintext). The caller proves who it is
// with a bearer token per call (WithBearer).
func CallerDialOptions(roots *x509.CertPool) []grpc.DialOption {
	if roots == nil {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots}))}
}
