package identity

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/stranger"
)

// InsecurePeerHeader names the calling service on a plaintext connection.
// Only a guard without credentials (the explicit development flag) reads
// it, and it believes it: that is what plaintext means.
const InsecurePeerHeader = "x-v0m3-insecure-peer"

// Kinds of Caller.
const (
	// KindUser is a person or product service authenticated by a bearer
	// token.
	KindUser = "user"
	// KindService is a V0M3 service authenticated by its certificate.
	KindService = "service"
)

// Guard admits or refuses each RPC before its handler runs, by the access
// table: a peer service by its verified certificate, a product or admin
// caller by a verified bearer token. It puts who was admitted into the
// context (CallerFrom, PeerFrom).
type Guard struct {
	// Creds are this server's credentials; nil means plaintext development
	// mode, where peers name themselves in InsecurePeerHeader.
	Creds *Credentials
	// Authn verifies bearer tokens; nil admits no bearer callers.
	Authn Authenticator
	// Log receives refusals (never tokens).
	Log *slog.Logger
	// Limit admits each bearer-token caller's requests at its rate; nil
	// admits them without limit. Peer services are never limited.
	Limit *CallerLimiter

	// logged bounds the refusals logged (stranger.Refusals): a flood of
	// refused requests (a garbage token needs no account, and no caller
	// rate limit applies before a token verifies) would otherwise write a
	// line each. The next line logged says how many were not.
	logged     stranger.Refusals
	loggedOnce sync.Once
}

// Unary returns the guard as a unary interceptor.
func (g *Guard) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := g.admit(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// Stream returns the guard as a stream interceptor.
func (g *Guard) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := g.admit(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &guardedStream{ServerStream: ss, ctx: ctx})
	}
}

type guardedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *guardedStream) Context() context.Context { return s.ctx }

func (g *Guard) admit(ctx context.Context, method string) (context.Context, error) {
	a, ok := AccessFor(method)
	if !ok {
		return nil, g.refuse(ctx, method, codes.PermissionDenied, "RPC_NOT_ALLOWED",
			fmt.Sprintf("%s is not in the access table; nobody may call it", method), nil, nil)
	}
	if a.Anyone {
		return ctx, nil
	}
	svc, err := g.peerService(ctx)
	if err != nil {
		return nil, g.refuse(ctx, method, codes.Unauthenticated, "PEER_CERTIFICATE_INVALID", err.Error(), nil, nil)
	}
	if svc != "" && slices.Contains(a.Peers, svc) {
		ctx = WithPeer(ctx, svc)
		return WithCaller(ctx, Caller{ID: svc, Kind: KindService, Issuer: "v0m3"}), nil
	}
	if !a.Callers {
		who := "a caller without a service certificate"
		if svc != "" {
			who = "the " + svc + " service"
		}
		return nil, g.refuse(ctx, method, codes.PermissionDenied, "PEER_NOT_ALLOWED",
			fmt.Sprintf("%s may be called only by the %s service; %s may not call it", method, strings.Join(a.Peers, ", "), who),
			map[string]string{"allowed_peers": strings.Join(a.Peers, ",")}, nil)
	}
	token, err := bearer(ctx)
	if err != nil {
		return nil, g.refuse(ctx, method, codes.Unauthenticated, "CREDENTIALS_MISSING", err.Error(), nil, nil)
	}
	if g.Authn == nil {
		return nil, g.refuse(ctx, method, codes.Unauthenticated, "AUTHENTICATION_NOT_CONFIGURED",
			"this server accepts no bearer tokens: configure an OIDC issuer (--oidc-issuer) or TokenReview (--token-review)", nil, nil)
	}
	c, err := g.verify(ctx, method, token, "bearer token", nil)
	if err != nil {
		return nil, err
	}
	if err := g.Limit.Admit(ctx, c.ID, c.Groups); err != nil {
		return nil, err // logged by the limiter when the flood starts, not per request
	}
	// An end user's token is checked only once its bearer passed, so a
	// forged one costs within the caller's own rate.
	if ctx, err = g.admitUser(ctx, method); err != nil {
		return nil, err
	}
	return WithCaller(ctx, c), nil
}

// verify authenticates token, the caller's own or an end user's (what
// names it in messages, md in the refusal's metadata), and refuses it as
// the authenticator says, or when its subject is in a namespace the
// issuer may not vouch for: one place for every authenticator (OIDC,
// TokenReview, the development issuer, a Chain of them), so no token
// yields a service's principal.
func (g *Guard) verify(ctx context.Context, method, token, what string, md map[string]string) (Caller, error) {
	c, err := g.Authn.Authenticate(ctx, token)
	if err != nil {
		code, reason, msg := codes.Unauthenticated, "TOKEN_INVALID", what+" refused: "+err.Error()
		var (
			ae    *AuthError
			cause error
		)
		if errors.As(err, &ae) {
			reason, cause = ae.Reason, ae.Cause
			if ae.Unavailable {
				code, msg = codes.Unavailable, what+" not checked: "+err.Error()
			}
		}
		return Caller{}, g.refuse(ctx, method, code, reason, msg, md, cause)
	}
	if err := CheckSubject(c.ID, c.Issuer); err != nil {
		return Caller{}, g.refuse(ctx, method, codes.Unauthenticated, ReasonPrincipalReserved, what+" refused: "+err.Error(), md, nil)
	}
	c.Kind = KindUser
	return c, nil
}

// refuse returns the refusal the caller gets and logs it, unless too
// many came lately (see refusalLogRate), with its cause when one is known
// (never a token, and never sent to the caller).
func (g *Guard) refuse(ctx context.Context, method string, code codes.Code, reason, msg string, md map[string]string, cause error) error {
	err := apierror.New(code, reason, msg, md)
	if g.Log == nil {
		return err
	}
	g.loggedOnce.Do(func() { g.logged.Log = g.Log })
	attrs := []any{"method", method, "code", code.String(), "reason", reason}
	if cause != nil {
		attrs = append(attrs, "cause", cause.Error())
	}
	g.logged.Warn(ctx, "rpc refused", attrs...)
	return err
}

// peerService returns the service the caller's verified certificate names,
// "" when it presented none.
func (g *Guard) peerService(ctx context.Context) (string, error) {
	if g.Creds == nil {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get(InsecurePeerHeader); len(v) == 1 {
			return v[0], nil
		}
		return "", nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", errors.New("the connection is not TLS")
	}
	if len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", nil
	}
	svc := ServiceOf(info.State.VerifiedChains[0][0])
	if svc == "" {
		return "", errors.New("the client certificate names no V0M3 service")
	}
	return svc, nil
}

// bearer returns the bearer token of the call.
func bearer(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get("authorization")
	if len(v) == 0 {
		return "", errors.New("this RPC needs a bearer token: send the header 'authorization: Bearer <token>'")
	}
	if len(v) > 1 {
		return "", errors.New("more than one authorization header")
	}
	scheme, tok, ok := strings.Cut(v[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(tok) == "" {
		return "", errors.New("the authorization header must be 'Bearer <token>'")
	}
	return strings.TrimSpace(tok), nil
}

// WithBearer returns ctx with a bearer token for outgoing calls, in place
// of any token ctx carried: a call names exactly one caller.
func WithBearer(ctx context.Context, token string) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set("authorization", "Bearer "+token)
	return metadata.NewOutgoingContext(ctx, md)
}
