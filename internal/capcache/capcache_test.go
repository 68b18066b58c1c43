package capcache_test

import (
	"context"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/capcache"
	"github.com/v0m3/v0m3/internal/digest"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// registry answers GetCapability with revision served (or, when wrong is
// set, always with revision 1) and counts the calls.
type registry struct {
	registryv1.RegistryServiceClient
	calls atomic.Int64
	wrong bool
}

func (r *registry) GetCapability(_ context.Context, in *registryv1.GetCapabilityRequest, _ ...grpc.CallOption) (*registryv1.Capability, error) {
	r.calls.Add(1)
	rev := in.GetRevision()
	if r.wrong {
		rev = 1
	}
	schema, _ := structpb.NewStruct(map[string]any{"type": "object", "revision": float64(rev)})
	return &registryv1.Capability{Name: in.GetName(), Revision: rev, Description: "contract", InputSchema: schema}, nil
}

// A revision is read from the registry once, then from the cache, as the
// caller's own copy; a new revision is read again; and the cache refuses
// to guess a revision or to keep an answer for another revision.
func TestCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := &registry{}
	var c capcache.Cache
	for range 3 {
		got, err := c.Get(ctx, reg, "retrieve", 2)
		if err != nil || got.GetRevision() != 2 || got.GetDescription() != "contract" {
			t.Fatalf("Get = %v, %v", got, err)
		}
		got.Description = "changed by a caller"
	}
	if n := reg.calls.Load(); n != 1 {
		t.Errorf("registry asked %d times for one revision, want once", n)
	}
	if got, err := c.Get(ctx, reg, "retrieve", 3); err != nil || got.GetRevision() != 3 || reg.calls.Load() != 2 {
		t.Errorf("a new revision = %v, %v after %d registry calls; want it read from the registry", got, err, reg.calls.Load())
	}
	if _, err := c.Get(ctx, reg, "retrieve", 0); err == nil {
		t.Error("Get at revision 0 (current, unknown) succeeded; the caller must name the revision")
	}
	if _, err := c.Get(ctx, &registry{wrong: true}, "retrieve", 5); err == nil {
		t.Error("the registry answered revision 1 for revision 5 and the cache accepted it")
	}
}

// Contract gives, with each revision, the digest of that revision's input
// schema, the same from the cache as when first read.
func TestContractSchemaDigest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := &registry{}
	var c capcache.Cache
	seen := map[string]bool{}
	for _, rev := range []int64{2, 2, 3} {
		got, d, err := c.Contract(ctx, reg, "retrieve", rev)
		if err != nil {
			t.Fatalf("Contract r%d: %v", rev, err)
		}
		want, _ := digest.Struct(got.GetInputSchema())
		if d != want || d == "" {
			t.Errorf("r%d: schema digest %q, want %q", rev, d, want)
		}
		seen[d] = true
	}
	if len(seen) != 2 || reg.calls.Load() != 2 {
		t.Errorf("%d digests from %d registry reads for two revisions, want 2 and 2", len(seen), reg.calls.Load())
	}
}
