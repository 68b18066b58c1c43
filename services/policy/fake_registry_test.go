package policy

import (
	"context"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// fakeRegistry is an in-memory registry: a dependency of the policy
// service, not the thing under test. Tests set its contents directly.
type fakeRegistry struct {
	registryv1.UnimplementedRegistryServiceServer

	mu       sync.Mutex
	caps     map[string]*registryv1.Capability
	mappings map[string]*registryv1.Mapping
	conns    map[string]*registryv1.Connection
	// mappingReads counts GetMapping calls.
	mappingReads int
}

func newFakeRegistry() *fakeRegistry {
	return &fakeRegistry{
		caps:     map[string]*registryv1.Capability{},
		mappings: map[string]*registryv1.Mapping{},
		conns:    map[string]*registryv1.Connection{},
	}
}

func (f *fakeRegistry) addCapability(name string, effect registryv1.EffectClass) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.caps[name] = &registryv1.Capability{Name: name, Revision: 1, EffectClass: effect}
}

func (f *fakeRegistry) addConnection(id string, state registryv1.ConnectionState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conns[id] = &registryv1.Connection{Id: id, State: state, ConfigRevision: 1}
}

func (f *fakeRegistry) putMapping(id, capability, conn string, rev int64, state registryv1.MappingState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mappings[id] = &registryv1.Mapping{Id: id, Revision: rev, Capability: capability, ConnectionId: conn, State: state}
}

// reads returns how many times GetMapping was called.
func (f *fakeRegistry) reads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mappingReads
}

func (f *fakeRegistry) GetCapability(_ context.Context, req *registryv1.GetCapabilityRequest) (*registryv1.Capability, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.caps[req.GetName()]
	if !ok {
		return nil, apierror.New(codes.NotFound, "CAPABILITY_UNKNOWN", "no such capability", nil)
	}
	return proto.Clone(c).(*registryv1.Capability), nil
}

func (f *fakeRegistry) ListCapabilities(context.Context, *registryv1.ListCapabilitiesRequest) (*registryv1.ListCapabilitiesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &registryv1.ListCapabilitiesResponse{}
	for _, c := range f.caps {
		resp.Capabilities = append(resp.Capabilities, proto.Clone(c).(*registryv1.Capability))
	}
	// Reverse order, so the policy service's own sorting is exercised.
	slices.SortFunc(resp.Capabilities, func(a, b *registryv1.Capability) int { return strings.Compare(b.GetName(), a.GetName()) })
	return resp, nil
}

func (f *fakeRegistry) GetMapping(_ context.Context, req *registryv1.GetMappingRequest) (*registryv1.Mapping, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mappingReads++
	m, ok := f.mappings[req.GetId()]
	if !ok {
		return nil, apierror.New(codes.NotFound, "MAPPING_UNKNOWN", "no such mapping", nil)
	}
	return proto.Clone(m).(*registryv1.Mapping), nil
}

func (f *fakeRegistry) ListMappings(_ context.Context, req *registryv1.ListMappingsRequest) (*registryv1.ListMappingsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &registryv1.ListMappingsResponse{}
	for _, m := range f.mappings {
		if req.GetCapability() != "" && m.GetCapability() != req.GetCapability() ||
			req.GetConnectionId() != "" && m.GetConnectionId() != req.GetConnectionId() ||
			req.GetState() != registryv1.MappingState_MAPPING_STATE_UNSPECIFIED && m.GetState() != req.GetState() {
			continue
		}
		resp.Mappings = append(resp.Mappings, proto.Clone(m).(*registryv1.Mapping))
	}
	return resp, nil
}

func (f *fakeRegistry) GetConnection(_ context.Context, req *registryv1.GetConnectionRequest) (*registryv1.Connection, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.conns[req.GetId()]
	if !ok {
		return nil, apierror.New(codes.NotFound, "CONNECTION_UNKNOWN", "no such connection", nil)
	}
	return proto.Clone(c).(*registryv1.Connection), nil
}
