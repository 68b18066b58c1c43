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
	"fmt"
	"slices"
	"strings"
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

// Principal is how a record names the caller (audit records, a
// connection's proposer, a config revision's author): a person's or
// product service's verified id as it is, a V0M3 service's SPIFFE URI
// (ServiceURI). The namespaces cannot meet: no bearer token may carry a
// subject in a service's namespace (CheckSubject), so no person or
// product service is ever recorded as a service.
func (c Caller) Principal() string {
	if c.Kind == KindService {
		return ServiceURI(c.ID)
	}
	return c.ID
}

// IssuerKubernetes is the Issuer of a caller Kubernetes TokenReview
// authenticated: the only issuer whose subjects may be in the product
// service namespace (ProductServicePrefix).
const IssuerKubernetes = "kubernetes"

// Principal namespaces. People, product services and V0M3 services each
// have their own; an id in one can never be taken for an id in another.
const (
	// ProductServicePrefix starts the names Kubernetes gives workloads
	// (system:serviceaccount:<namespace>:<name>) and its own components:
	// product services calling with a ServiceAccount token. Only a token
	// the API server reviewed may carry one.
	ProductServicePrefix = "system:"
)

// servicePrefixes start the ids reserved for V0M3 services: their SPIFFE
// URIs (any SPIFFE id, whatever trust domain it names: only a
// certificate proves one) and the "service:" form older audit records
// used. Compared without regard to case.
var servicePrefixes = []string{"spiffe:", "service:"}

// ReasonPrincipalReserved is the ErrorInfo reason of a token, or a
// request, naming a principal in a namespace it may not use.
const ReasonPrincipalReserved = "PRINCIPAL_RESERVED"

// CheckSubject refuses a bearer-token subject that issuer may not
// vouch for: one in a V0M3 service's namespace (from any issuer), or in
// the product service namespace from anything but TokenReview. The error
// is an *AuthError with reason ReasonPrincipalReserved.
func CheckSubject(subject, issuer string) error {
	if inServiceNamespace(subject) {
		return authErr(ReasonPrincipalReserved, "the token's subject is in the namespace reserved for V0M3 services (%s); a token never names a service: services prove who they are with their certificate", strings.Join(servicePrefixes, ", "))
	}
	if issuer != IssuerKubernetes && hasPrefixFold(subject, ProductServicePrefix) {
		return authErr(ReasonPrincipalReserved, "the token's subject is in the namespace reserved for Kubernetes workloads (%s); only a token the Kubernetes API server reviewed may name one", ProductServicePrefix)
	}
	return nil
}

// CheckPerson refuses an id a request names as a person (a product
// service's end user): one in a V0M3 service's or a product service's
// namespace.
func CheckPerson(id string) error {
	if inServiceNamespace(id) || hasPrefixFold(id, ProductServicePrefix) {
		return fmt.Errorf("a person's id may not start with %s or %s: those name services", strings.Join(servicePrefixes, ", "), ProductServicePrefix)
	}
	return nil
}

func inServiceNamespace(id string) bool {
	return slices.ContainsFunc(servicePrefixes, func(p string) bool { return hasPrefixFold(id, p) })
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
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
