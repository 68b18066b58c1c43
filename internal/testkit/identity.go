package testkit

import (
	"context"

	"github.com/v0m3/v0m3/internal/identity"
)

// Person is someone calling with a verified bearer token: the token's
// subject and the groups it claims. demo/scenario's people (and any
// struct of the same two fields) convert to it.
type Person struct {
	ID     string
	Groups []string
}

// Minter mints a person's development token onto an outgoing context:
// a *suite.Suite, an *identity.DevIssuer, a *Guarded.
type Minter interface {
	As(ctx context.Context, subject string, groups ...string) context.Context
}

// As returns a background context whose calls carry p's token from m:
// how a test calls a served service "as this person", over the real
// guard. p is a Person or a struct of the same fields (scenario.Person).
func As[P ~struct {
	ID     string
	Groups []string
}](m Minter, p P) context.Context {
	q := Person(p)
	return m.As(context.Background(), q.ID, q.Groups...)
}

// AsUser returns ctx as a handler sees it once the guard admitted a
// person's verified token: for a test that calls a service's handlers in
// process, where no guard runs.
func AsUser(ctx context.Context, id string, groups ...string) context.Context {
	return identity.WithCaller(ctx, identity.Caller{ID: id, Groups: groups, Kind: identity.KindUser})
}

// AsService returns ctx as a handler sees it once the guard admitted the
// peer service's certificate: for a test that calls a service's handlers
// in process, as that peer.
func AsService(ctx context.Context, service string) context.Context {
	return identity.WithCaller(identity.WithPeer(ctx, service), identity.Caller{ID: service, Kind: identity.KindService})
}
