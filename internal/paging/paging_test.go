package paging_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/paging"
)

type req struct {
	size  int32
	token string
}

func (r req) GetPageSize() int32   { return r.size }
func (r req) GetPageToken() string { return r.token }

func items(n int) []string {
	out := make([]string, n)
	for i := range out {
		// Given out of order: Page orders by key.
		out[i] = fmt.Sprintf("item-%04d", n-1-i)
	}
	return out
}

func id(s string) string { return s }

func TestSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   int32
		want int
	}{{0, paging.DefaultSize}, {1, 1}, {50, 50}, {1000, 1000}, {1001, paging.MaxSize}, {1 << 30, paging.MaxSize}} {
		got, err := paging.Size(req{size: tc.in})
		if err != nil || got != tc.want {
			t.Errorf("Size(%d) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	if _, err := paging.Size(req{size: -1}); !apierror.Is(err, codes.InvalidArgument, paging.ReasonPageSizeNegative) {
		t.Errorf("Size(-1) = %v, want INVALID_ARGUMENT %s", err, paging.ReasonPageSizeNegative)
	}
}

// TestPageWalk walks whole lists at several sizes: every item once, in key
// order, and the last page has no token.
func TestPageWalk(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ n, size int }{{0, 10}, {1, 10}, {10, 10}, {11, 10}, {120, 0}, {2500, 2000}, {7, 1}} {
		t.Run(strconv.Itoa(tc.n)+"/"+strconv.Itoa(tc.size), func(t *testing.T) {
			t.Parallel()
			all := items(tc.n)
			filter := paging.Filter("state", "x")
			var got []string
			tok, pages := "", 0
			for {
				page, next, err := paging.Page(req{size: int32(tc.size), token: tok}, filter, all, id)
				if err != nil {
					t.Fatal(err)
				}
				pages++
				want := tc.size
				if want == 0 {
					want = paging.DefaultSize
				}
				want = min(want, paging.MaxSize)
				if len(page) > want {
					t.Fatalf("page of %d items, size %d", len(page), want)
				}
				got = append(got, page...)
				if next == "" {
					break
				}
				tok = next
				if pages > tc.n+1 {
					t.Fatal("no end")
				}
			}
			if len(got) != tc.n {
				t.Fatalf("got %d items, want %d", len(got), tc.n)
			}
			for i, g := range got {
				if g != fmt.Sprintf("item-%04d", i) {
					t.Fatalf("item %d is %s", i, g)
				}
			}
		})
	}
}

// TestPageStableUnderChange: items added before the position or the last
// returned item removed neither repeat nor skip anything.
func TestPageStableUnderChange(t *testing.T) {
	t.Parallel()
	all := []string{"b", "d", "f", "h"}
	f := paging.Filter()
	page, next, err := paging.Page(req{size: 2}, f, all, id)
	if err != nil || fmt.Sprint(page) != "[b d]" || next == "" {
		t.Fatalf("first page %v %q %v", page, next, err)
	}
	changed := []string{"a", "c", "f", "h", "i"} // d removed, a c i added
	page, next, err = paging.Page(req{size: 2, token: next}, f, changed, id)
	if err != nil || fmt.Sprint(page) != "[f h]" || next == "" {
		t.Fatalf("second page %v %q %v", page, next, err)
	}
	page, next, err = paging.Page(req{size: 2, token: next}, f, changed, id)
	if err != nil || fmt.Sprint(page) != "[i]" || next != "" {
		t.Fatalf("third page %v %q %v", page, next, err)
	}
}

func TestBadTokens(t *testing.T) {
	t.Parallel()
	all := items(30)
	_, next, err := paging.Page(req{size: 10}, paging.Filter("state", "ACTIVE"), all, id)
	if err != nil || next == "" {
		t.Fatal(next, err)
	}
	for _, tc := range []struct {
		name, token, filter, reason string
	}{
		{"other filter", next, paging.Filter("state", "CANCELLED"), paging.ReasonPageTokenFilterMismatch},
		{"no filter", next, paging.Filter(), paging.ReasonPageTokenFilterMismatch},
		{"not base64", "!!!", paging.Filter("state", "ACTIVE"), paging.ReasonPageTokenInvalid},
		{"not json", "bm90IGpzb24", paging.Filter("state", "ACTIVE"), paging.ReasonPageTokenInvalid},
		{"empty json", "e30", paging.Filter("state", "ACTIVE"), paging.ReasonPageTokenInvalid},
		{"truncated", next[:len(next)-3], paging.Filter("state", "ACTIVE"), paging.ReasonPageTokenInvalid},
		{"appended to", next + "x", paging.Filter("state", "ACTIVE"), paging.ReasonPageTokenInvalid},
		{"appended two", next + "xy", paging.Filter("state", "ACTIVE"), paging.ReasonPageTokenInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := paging.Page(req{size: 10, token: tc.token}, tc.filter, all, id)
			if !apierror.Is(err, codes.InvalidArgument, tc.reason) {
				t.Fatalf("got %v, want INVALID_ARGUMENT %s", err, tc.reason)
			}
			if f := apierror.Fields(err); len(f) != 1 || f[0] != "page_token" {
				t.Errorf("fields %v, want page_token", f)
			}
		})
	}
}

func TestFilterPairsAreDelimited(t *testing.T) {
	t.Parallel()
	if paging.Filter("ab", "c") == paging.Filter("a", "bc") {
		t.Fatal("filters with shifted boundaries collide")
	}
}

func TestCollect(t *testing.T) {
	t.Parallel()
	all := items(123)
	got, err := paging.Collect(context.Background(), func(_ context.Context, tok string) ([]string, string, error) {
		return paging.Page(req{size: 10, token: tok}, "f", all, id)
	})
	if err != nil || len(got) != 123 {
		t.Fatalf("Collect = %d items, %v", len(got), err)
	}
}

func TestPageAppendOnlyKeepsOrder(t *testing.T) {
	t.Parallel()
	all := []string{"c", "a", "b", "a2"}
	got := []string{}
	tok := ""
	for {
		page, next, err := paging.PageAppendOnly(req{size: 3, token: tok}, "f", all)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, page...)
		if next == "" {
			break
		}
		tok = next
		all = append(all, "later") // grows at its end between pages
	}
	if fmt.Sprint(got) != "[c a b a2 later]" {
		t.Fatalf("got %v", got)
	}
}
