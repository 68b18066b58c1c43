package testkit

import (
	"context"
	"slices"
	"testing"

	"github.com/v0m3/v0m3/internal/retryqueue"
)

// SpoolConformance checks what every store's retryqueue.Spool promises:
// records come back byte for byte in key order (the order they were
// queued), a deleted one is gone, deleting an absent key is no error,
// and a second Spool of the same store under another name is apart.
func SpoolConformance(t *testing.T, sp, other retryqueue.Spool) {
	t.Helper()
	ctx := context.Background()
	recs := map[string][]byte{"0002-b": []byte("second\x00record"), "0001-a": {0xff, 0x00, 0x01}, "0003-c": []byte("third")}
	for k, v := range recs {
		if err := sp.Put(ctx, k, v); err != nil {
			t.Fatalf("Put %s: %v", k, err)
		}
	}
	if err := other.Put(ctx, "0000-x", []byte("elsewhere")); err != nil {
		t.Fatal(err)
	}
	list := func() []string {
		t.Helper()
		kept, err := sp.List(ctx)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		var keys []string
		for _, k := range kept {
			if want, ok := recs[k.Key]; !ok || string(k.Rec) != string(want) {
				t.Errorf("List gave %s = %q, want %q", k.Key, k.Rec, want)
			}
			keys = append(keys, k.Key)
		}
		return keys
	}
	if got := list(); !slices.Equal(got, []string{"0001-a", "0002-b", "0003-c"}) {
		t.Errorf("List keys = %v, want them in key order", got)
	}
	for _, k := range []string{"0002-b", "0002-b", "never-put"} {
		if err := sp.Delete(ctx, k); err != nil {
			t.Errorf("Delete %s: %v", k, err)
		}
	}
	if got := list(); !slices.Equal(got, []string{"0001-a", "0003-c"}) {
		t.Errorf("after deleting 0002-b List keys = %v", got)
	}
	if kept, err := other.List(ctx); err != nil || len(kept) != 1 || kept[0].Key != "0000-x" {
		t.Errorf("the other spool lists %v, %v; want its one record", kept, err)
	}
}
