package identity

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// UserTokenHeader carries the end user's own bearer token on a call a
// product service makes for that user (StartTask's on_behalf_of). The
// guard verifies it exactly as it verifies the caller's token; the user's
// groups then come from it, never from the request body.
const UserTokenHeader = "x-v0m3-user-token"

type onBehalfOfKey struct{}

// OnBehalfOfFrom returns the end user whose token the caller presented in
// UserTokenHeader, verified by the guard.
func OnBehalfOfFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(onBehalfOfKey{}).(Caller)
	return c, ok
}

// WithOnBehalfOf returns ctx carrying a verified end user (see
// OnBehalfOfFrom). The guard sets it; tests of a single service's
// handlers may set it directly.
func WithOnBehalfOf(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, onBehalfOfKey{}, c)
}

// WithUserToken returns ctx with the end user's token for outgoing calls,
// in place of any ctx carried: a product service passes it with its own
// bearer token when it starts a task for that user.
func WithUserToken(ctx context.Context, token string) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(UserTokenHeader, token)
	return metadata.NewOutgoingContext(ctx, md)
}

// userToken returns the end user's token of the call, "" when none.
func userToken(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(UserTokenHeader)
	switch {
	case len(v) == 0:
		return "", nil
	case len(v) > 1:
		return "", errors.New("more than one " + UserTokenHeader + " header")
	}
	tok := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v[0]), "Bearer "))
	if tok == "" {
		return "", errors.New("the " + UserTokenHeader + " header is empty")
	}
	return tok, nil
}

// admitUser verifies the end user's token of a bearer caller's call, when
// it carries one, and puts the user into the context. A token that does not
// verify refuses the call, with the same reason a caller's own token would
// get and metadata saying which token it was.
func (g *Guard) admitUser(ctx context.Context, method string) (context.Context, error) {
	tok, err := userToken(ctx)
	if err != nil {
		return nil, g.refuse(ctx, method, codes.Unauthenticated, "CREDENTIALS_MISSING", err.Error(),
			map[string]string{"header": UserTokenHeader}, nil)
	}
	if tok == "" {
		return ctx, nil
	}
	u, err := g.verify(ctx, method, tok, "user token ("+UserTokenHeader+")", map[string]string{"header": UserTokenHeader})
	if err != nil {
		return nil, err
	}
	return WithOnBehalfOf(ctx, u), nil
}
