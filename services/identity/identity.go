// Package identity owns who is calling: the X.509 identity of each V0M3
// service (mutual TLS between services), the bearer-token identity of
// product and admin callers (OIDC/JWT and Kubernetes TokenReview), the one
// table that says which of them may call which RPC, and signatures a
// service puts on what it vouches for (execution grants, receipts).
//
// Nobody is trusted for their address or their word: a service is who its
// certificate says, a person or product service is who a verified token
// says, and a request body never names its own caller.
package identity

import (
	"context"
	"slices"
)

// Service names: the peers a certificate can name.
const (
	Orchestrator = "orchestrator"
	Registry     = "registry"
	Policy       = "policy"
	Evidence     = "evidence"
	Adapter      = "adapter"
	Operator     = "operator"
)

// Services lists every service identity a certificate may carry.
var Services = []string{Orchestrator, Registry, Policy, Evidence, Adapter, Operator}

// Caller is an authenticated product or admin caller: a person or a
// product service, as a verified bearer token says.
type Caller struct {
	// ID is the subject, e.g. "alice" or
	// "system:serviceaccount:writer:writer".
	ID string
	// Groups are the groups the token asserts.
	Groups []string
	// Issuer names who vouched for the caller, e.g. the OIDC issuer URL or
	// "kubernetes".
	Issuer string
	// Kind is KindUser for a bearer-token caller and KindService for a
	// V0M3 service authenticated by its certificate.
	Kind string
}

// InGroup reports whether the caller belongs to group.
func (c Caller) InGroup(group string) bool { return slices.Contains(c.Groups, group) }

type callerKey struct{}
type peerKey struct{}

// WithCaller returns ctx carrying an authenticated caller. The guard sets
// it; tests of a single service's handlers may set it directly.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the authenticated caller of the RPC, if a bearer
// token authenticated one.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// WithPeer returns ctx carrying the calling service's verified name.
func WithPeer(ctx context.Context, service string) context.Context {
	return context.WithValue(ctx, peerKey{}, service)
}

// PeerFrom returns the name of the V0M3 service whose certificate
// authenticated the RPC, or "" when the caller is not a peer service.
func PeerFrom(ctx context.Context) string {
	s, _ := ctx.Value(peerKey{}).(string)
	return s
}
