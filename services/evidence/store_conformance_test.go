package evidence_test

import (
	"path/filepath"
	"testing"

	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/services/evidence"
	"github.com/v0m3/v0m3/services/evidence/storetest"
)

func TestBoltStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) evidence.Store {
		db, err := store.Open(filepath.Join(t.TempDir(), "evidence.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return evidence.NewBoltStore(db)
	})
}

func TestRedisStoreConformance(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	storetest.Run(t, func(t *testing.T) evidence.Store {
		return evidence.NewRedisStore(redistest.Client(t, addr), redistest.Prefix(t))
	})
}
