package registry_test

import (
	"path/filepath"
	"testing"

	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/services/registry"
	"github.com/v0m3/v0m3/services/registry/storetest"
)

func TestBoltStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) registry.Store {
		db, err := store.Open(filepath.Join(t.TempDir(), "registry.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return registry.NewBoltStore(db)
	})
}

func TestRedisStoreConformance(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	storetest.Run(t, func(t *testing.T) registry.Store {
		return registry.NewRedisStore(redistest.Client(t, addr), redistest.Prefix(t))
	})
}
