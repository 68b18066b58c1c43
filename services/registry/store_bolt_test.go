package registry

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/v0m3/v0m3/internal/store"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestListEventsPages checks the prefix walk that replaces a seek: every
// starting point, across digit boundaries, returns exactly the events after
// it, in order.
func TestListEventsPages(t *testing.T) {
	t.Parallel()
	db, err := store.Open(filepath.Join(t.TempDir(), "registry.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	const n = 123
	err = db.Update(func(tx *store.Tx) error {
		evs := make([]*registryv1.RegistryEvent, n)
		for i := range evs {
			evs[i] = &registryv1.RegistryEvent{Detail: "e"}
		}
		return appendEvents(tx, evs)
	})
	if err != nil {
		t.Fatal(err)
	}
	st := NewBoltStore(db)
	for _, limit := range []int{1, 7, 256} {
		for after := int64(0); after <= n+1; after++ {
			got, err := st.ListEvents(t.Context(), after, limit)
			if err != nil {
				t.Fatal(err)
			}
			var seqs, want []int64
			for _, ev := range got {
				seqs = append(seqs, ev.GetSequence())
			}
			for s := after + 1; s <= n && len(want) < limit; s++ {
				want = append(want, s)
			}
			if !slices.Equal(seqs, want) {
				t.Fatalf("ListEvents(after %d, limit %d) = %v, want %v", after, limit, seqs, want)
			}
		}
	}
}
