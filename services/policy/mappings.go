package policy

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// maxMappingEntries bounds the mapping cache; past it the cache starts
// again empty.
const maxMappingEntries = 1024

// mappingFacts is what policy needs of a mapping that never changes, so
// that a decision does not read the registry for it each time:
//
//   - its capability and connection, fixed by the mapping id: the registry
//     refuses a new revision that changes either (ProposeMapping,
//     MAPPING_MISMATCH: a different binding is a new mapping);
//   - the capability revision one of its revisions was reviewed against,
//     fixed when that revision is proposed. Only a revision a registry read
//     showed current and active is kept (revision 0: none yet).
//
// Whether that revision is still current and active is not a fact: the
// orchestrator asks the registry (ResolveExecution) in the same governed
// call, before it asks policy to decide.
type mappingFacts struct {
	capability, connectionID     string
	revision, capabilityRevision int64
}

// mappingCache holds mappingFacts by mapping id. The zero value is ready
// to use.
type mappingCache struct {
	mu sync.RWMutex
	m  map[string]mappingFacts
}

func (c *mappingCache) get(id string) (mappingFacts, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	f, ok := c.m[id]
	return f, ok
}

// put keeps the facts of m, as the registry has just returned it, and
// returns them.
func (c *mappingCache) put(m *registryv1.Mapping) mappingFacts {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.m[m.GetId()]
	f.capability, f.connectionID = m.GetCapability(), m.GetConnectionId()
	if m.GetState() == registryv1.MappingState_MAPPING_STATE_ACTIVE {
		f.revision, f.capabilityRevision = m.GetRevision(), m.GetCapabilityRevision()
	}
	if c.m == nil || len(c.m) >= maxMappingEntries {
		c.m = map[string]mappingFacts{}
	}
	c.m[m.GetId()] = f
	return f
}

// mapping returns the facts of mapping id, from the cache or, on a miss,
// from the registry, and checks that it implements capability. A mapping
// the registry does not know is not cached.
func (s *Server) mapping(ctx context.Context, id, capability string) (mappingFacts, error) {
	f, ok := s.mappings.get(id)
	if !ok {
		var err error
		if _, f, err = s.readMapping(ctx, id); err != nil {
			return mappingFacts{}, err
		}
	}
	return f, implements(id, f, capability)
}

// readMapping reads a mapping's current revision from the registry, and
// keeps and returns its facts.
func (s *Server) readMapping(ctx context.Context, id string) (*registryv1.Mapping, mappingFacts, error) {
	m, err := s.deps.Registry.GetMapping(ctx, &registryv1.GetMappingRequest{Id: id})
	if err != nil {
		return nil, mappingFacts{}, apierror.Propagate(err, "policy: look up mapping")
	}
	return m, s.mappings.put(m), nil
}

// implements refuses a mapping that implements another capability.
func implements(id string, f mappingFacts, capability string) error {
	if f.capability == capability {
		return nil
	}
	return apierror.New(codes.FailedPrecondition, "MAPPING_CAPABILITY_MISMATCH",
		fmt.Sprintf("mapping %s implements %s, not %s", id, f.capability, capability),
		map[string]string{"mapping_id": id, "capability": capability})
}
