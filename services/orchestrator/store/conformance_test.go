package store_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/v0m3/v0m3/internal/redistest"
	kv "github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/services/orchestrator/store"
	"github.com/v0m3/v0m3/services/orchestrator/storetest"
)

func TestBoltStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) store.Store {
		db, err := kv.Open(filepath.Join(t.TempDir(), "orchestrator.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return store.NewBoltStore(db)
	})
}

func TestRedisStoreConformance(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		return store.NewRedisStore(redistest.Client(t, addr), redistest.Prefix(t))
	})
}

// TestRedisReplicas runs two stores with separate connection pools (as two
// processes would have) against one Redis and one deployment prefix: one
// provider call submitted to both at once creates one request, and an
// approval is used once.
func TestRedisReplicas(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	prefix := redistest.Prefix(t)
	a := store.NewRedisStore(redistest.Client(t, addr), prefix)
	b := store.NewRedisStore(redistest.Client(t, addr), prefix)
	storetest.RunShared(t, a, b)
}

// TestRedisLeaseGenerationsExpire checks that Redis does not keep a lease
// generation for every request ever leased: each expires (see
// store.Fence), while a renewal keeps it.
func TestRedisLeaseGenerationsExpire(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	c := redistest.Client(t, addr)
	prefix := redistest.Prefix(t)
	st := store.NewRedisStore(c, prefix)
	ctx := t.Context()
	for _, id := range []string{"req_1", "req_2"} {
		gen, err := st.AcquireLease(ctx, id, "replica_a", 0, time.Minute)
		if err != nil || gen == 0 {
			t.Fatalf("acquire %s = %d, %v", id, gen, err)
		}
		if gen, err = st.AcquireLease(ctx, id, "replica_a", gen, time.Minute); err != nil || gen == 0 {
			t.Fatalf("renew %s = %d, %v", id, gen, err)
		}
		if err := st.ReleaseLease(ctx, id, "replica_a"); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := c.Keys(ctx, "*leasegen:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Fatalf("lease generation keys = %q; want one per request", keys)
	}
	for _, k := range keys {
		if ttl, err := c.PTTL(ctx, k).Result(); err != nil || ttl <= 0 {
			t.Errorf("%s expires in %v, %v; want an expiry", k, ttl, err)
		}
	}
}
