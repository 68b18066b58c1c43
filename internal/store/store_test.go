package store_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/v0m3/v0m3/internal/store"
)

// Concurrent Batch calls all commit, each sees the writes of those
// committed before it in the same group, and a failing function neither
// stores anything nor keeps the others' writes from being stored; once
// Batch returns, the write is on disk (it survives reopening the file).
func TestBatch(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "db")
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	const n = 64
	var wg sync.WaitGroup
	errs := make([]error, n)
	runs := make([]int, n)
	var runsMu sync.Mutex
	for i := range n {
		wg.Go(func() {
			errs[i] = db.Batch(func(tx *store.Tx) error {
				runsMu.Lock()
				runs[i]++
				runsMu.Unlock()
				// A shared counter: lost updates would show as a total
				// below the number of successful calls.
				c := &wrapperspb.Int64Value{}
				if err := tx.Get("b", "counter", c); err != nil && !errors.Is(err, store.ErrNotFound) {
					return err
				}
				if err := tx.Put("b", "counter", wrapperspb.Int64(c.GetValue()+1)); err != nil {
					return err
				}
				if err := tx.Create("b", fmt.Sprint("key-", i), wrapperspb.Int64(int64(i))); err != nil {
					return err
				}
				if i%8 == 0 {
					return fmt.Errorf("refused %d", i)
				}
				return nil
			})
		})
	}
	wg.Wait()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if db, err = store.Open(path); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ok := 0
	for i := range n {
		if runs[i] < 1 {
			t.Errorf("call %d never ran", i)
		}
		err := db.View(func(tx *store.Tx) error { return tx.Get("b", fmt.Sprint("key-", i), &wrapperspb.Int64Value{}) })
		if i%8 == 0 {
			if errs[i] == nil || errs[i].Error() != fmt.Sprintf("refused %d", i) {
				t.Errorf("call %d: err = %v, want its own refusal", i, errs[i])
			}
			if !errors.Is(err, store.ErrNotFound) {
				t.Errorf("call %d failed but its write is stored (%v)", i, err)
			}
			continue
		}
		ok++
		if errs[i] != nil || err != nil {
			t.Errorf("call %d: err = %v, stored: %v", i, errs[i], err)
		}
	}
	c := &wrapperspb.Int64Value{}
	if err := db.View(func(tx *store.Tx) error { return tx.Get("b", "counter", c) }); err != nil || c.GetValue() != int64(ok) {
		t.Errorf("counter = %d, %v; want %d (one per successful call)", c.GetValue(), err, ok)
	}
}

// Pages freed before the file was closed are used again after it is
// opened (the free page list is rebuilt at open, not read from the file),
// so a file whose records come and go keeps its size across restarts.
func TestFreedPagesReusedAfterReopen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "db")
	value := wrapperspb.String(strings.Repeat("x", 4096))
	fill := func(db *store.DB, round int) {
		t.Helper()
		for i := range 64 {
			if err := db.Update(func(tx *store.Tx) error { return tx.Put("b", fmt.Sprintf("%d/%03d", round, i), value) }); err != nil {
				t.Fatal(err)
			}
		}
	}
	empty := func(db *store.DB, round int) {
		t.Helper()
		for i := range 64 {
			if err := db.Update(func(tx *store.Tx) error { return tx.Delete("b", fmt.Sprintf("%d/%03d", round, i)) }); err != nil {
				t.Fatal(err)
			}
		}
	}
	size := func() int64 {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	fill(db, 0)
	empty(db, 0)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	before := size()
	for round := 1; round <= 3; round++ {
		if db, err = store.Open(path); err != nil {
			t.Fatal(err)
		}
		fill(db, round)
		var got wrapperspb.StringValue
		if err := db.View(func(tx *store.Tx) error { return tx.Get("b", fmt.Sprintf("%d/063", round), &got) }); err != nil || got.GetValue() != value.GetValue() {
			t.Fatalf("round %d: the last record read back as %d bytes, %v", round, len(got.GetValue()), err)
		}
		empty(db, round)
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if after := size(); after > before {
		t.Errorf("the file grew from %d to %d bytes over three rounds of the same records", before, after)
	}
}
