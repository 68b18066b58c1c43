package store_test

import (
	"path/filepath"
	"testing"

	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/testkit"
)

func TestSpool(t *testing.T) {
	t.Parallel()
	db, err := store.Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	testkit.SpoolConformance(t, db.Spool("audit"), db.Spool("protocol-trace"))
}
