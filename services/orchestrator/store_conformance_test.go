package orchestrator_test

import (
	"path/filepath"
	"testing"

	"github.com/v0m3/v0m3/services/internal/redistest"
	"github.com/v0m3/v0m3/services/internal/store"
	"github.com/v0m3/v0m3/services/orchestrator"
	"github.com/v0m3/v0m3/services/orchestrator/storetest"
)

func TestBoltStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) orchestrator.Store {
		db, err := store.Open(filepath.Join(t.TempDir(), "orchestrator.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return orchestrator.NewBoltStore(db)
	})
}

func TestRedisStoreConformance(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	storetest.Run(t, func(t *testing.T) orchestrator.Store {
		return orchestrator.NewRedisStore(redistest.Client(t, addr), redistest.Prefix(t))
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
	a := orchestrator.NewRedisStore(redistest.Client(t, addr), prefix)
	b := orchestrator.NewRedisStore(redistest.Client(t, addr), prefix)
	storetest.RunShared(t, a, b)
}
