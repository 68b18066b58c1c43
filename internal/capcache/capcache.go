// Package capcache keeps capability contracts by name and revision for the
// services that read them on every call. A capability revision's contract
// never changes (a new contract is a new revision), so an entry can never
// be stale: the caller learns the current revision from an authoritative
// check it makes anyway (an active mapping names the capability revision
// it was reviewed against, and a capability revision sends its active
// mappings to review in the same transaction), and looks the contract up
// here by it.
//
// Only the contract is fixed by a revision; the definition state
// (deprecation) is not, and callers of this cache must not decide on it.
package capcache

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/digest"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// maxEntries bounds the cache; past it the cache starts again empty.
const maxEntries = 1024

type key struct {
	name     string
	revision int64
}

// Cache holds capability contracts by (name, revision). The zero value is
// ready to use.
type Cache struct {
	mu sync.RWMutex
	m  map[key]entry
}

// entry is a contract and the digest of its input schema, computed once
// per revision rather than on every call that checks it.
type entry struct {
	capability   *registryv1.Capability
	schemaDigest string
}

// Get returns capability name at revision (which must be positive), from
// the cache or from the registry. The result is the caller's own copy.
func (c *Cache) Get(ctx context.Context, reg registryv1.RegistryServiceClient, name string, revision int64) (*registryv1.Capability, error) {
	got, _, err := c.Contract(ctx, reg, name, revision)
	return got, err
}

// Contract is Get that also returns the digest of the contract's input
// schema (digest.Struct).
func (c *Cache) Contract(ctx context.Context, reg registryv1.RegistryServiceClient, name string, revision int64) (*registryv1.Capability, string, error) {
	if revision <= 0 {
		return nil, "", fmt.Errorf("capcache: capability %s: revision %d is not a revision", name, revision)
	}
	k := key{name, revision}
	c.mu.RLock()
	hit, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return proto.CloneOf(hit.capability), hit.schemaDigest, nil
	}
	got, err := reg.GetCapability(ctx, &registryv1.GetCapabilityRequest{Name: name, Revision: revision})
	if err != nil {
		return nil, "", err
	}
	if got.GetName() != name || got.GetRevision() != revision {
		return nil, "", fmt.Errorf("capcache: asked for capability %s revision %d, got %s revision %d", name, revision, got.GetName(), got.GetRevision())
	}
	d, err := digest.Struct(got.GetInputSchema())
	if err != nil {
		return nil, "", fmt.Errorf("capcache: capability %s revision %d: digest its input schema: %w", name, revision, err)
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxEntries {
		c.m = map[key]entry{}
	}
	c.m[k] = entry{capability: proto.CloneOf(got), schemaDigest: d}
	c.mu.Unlock()
	return got, d, nil
}
