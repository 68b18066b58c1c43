package policy_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	"github.com/v0m3/v0m3/services/internal/redistest"
	"github.com/v0m3/v0m3/services/internal/store"
	"github.com/v0m3/v0m3/services/policy"
	"github.com/v0m3/v0m3/services/policy/storetest"
)

func TestBoltStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) policy.Store {
		db, err := store.Open(filepath.Join(t.TempDir(), "policy.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return policy.NewBoltStore(db)
	})
}

func TestRedisStoreConformance(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	storetest.Run(t, func(t *testing.T) policy.Store {
		return policy.NewRedisStore(redistest.Client(t, addr), redistest.Prefix(t))
	})
}

// TestRedisHandleTTL checks that Redis forgets a handle on its own a day
// after it expires, even if no sweep ever runs.
func TestRedisHandleTTL(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	c := redistest.Client(t, addr)
	st := policy.NewRedisStore(c, "ttl")
	ctx := context.Background()
	exp := time.Now().Add(time.Hour)
	if err := st.CreateHandle(ctx, "k1", &policyv1.HandleBinding{TaskId: "t", ExpireTime: timestamppb.New(exp)}); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(ctx, "{ttl:policy}:handle:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("handle keys = %v, %v", keys, err)
	}
	ttl, err := c.PTTL(ctx, keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl < 24*time.Hour || ttl > 25*time.Hour+time.Minute {
		t.Errorf("handle TTL = %v, want about expiry + 24h (25h)", ttl)
	}
}
