// Package paging is the one place list calls page their results (AIP-158):
// page_size defaults to DefaultSize, larger than MaxSize is read as
// MaxSize, negative fails; page_token is opaque, names the position after
// the last item returned, and is bound to the filters it was issued for.
//
// A list is ordered by a key each handler supplies (stable and unique per
// item, e.g. a creation time and id); the next page starts after the last
// key returned, so an item added or removed between calls neither repeats
// nor skips another. Stores may list everything and let Page slice it.
package paging

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
)

// Page sizes.
const (
	// DefaultSize is the page size when a request sets none.
	DefaultSize = 50
	// MaxSize is the largest page; a larger page_size is read as this.
	MaxSize = 1000
)

// Error reasons.
const (
	// ReasonPageSizeNegative refuses a negative page_size.
	ReasonPageSizeNegative = "PAGE_SIZE_NEGATIVE"
	// ReasonPageTokenInvalid refuses a token this service did not issue.
	ReasonPageTokenInvalid = "PAGE_TOKEN_INVALID"
	// ReasonPageTokenFilterMismatch refuses a token issued for other
	// filters.
	ReasonPageTokenFilterMismatch = "PAGE_TOKEN_FILTER_MISMATCH"
)

// Request is what every paged list request has.
type Request interface {
	GetPageSize() int32
	GetPageToken() string
}

// token is a page token's content before encoding. It holds a position
// the caller has already seen and a digest of the filters: nothing a
// caller could not learn from the page it was given.
type token struct {
	// Filter is the digest of the filters the token was issued for.
	Filter string `json:"f"`
	// After is the key of the last item returned.
	After string `json:"a"`
}

// Filter describes a list's filters for binding a token: name/value pairs
// in a fixed order, e.g. Filter("task_id", id, "state", state.String()).
// Callers include everything that changes which items are listed, the
// caller's identity too when visibility depends on it.
func Filter(pairs ...string) string {
	h := sha256.New()
	for _, p := range pairs {
		// Length-prefixed, so ("ab","c") and ("a","bc") differ.
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// Size returns the page size of req: DefaultSize for 0, at most MaxSize,
// INVALID_ARGUMENT for a negative size.
func Size(req Request) (int, error) {
	n := req.GetPageSize()
	switch {
	case n < 0:
		return 0, apierror.InvalidArgument(ReasonPageSizeNegative, fmt.Sprintf("page_size must not be negative (got %d)", n),
			apierror.FieldViolation{Field: "page_size", Description: "must be 0 (default) or positive"})
	case n == 0:
		return DefaultSize, nil
	case n > MaxSize:
		return MaxSize, nil
	}
	return int(n), nil
}

// After returns the key a request's page starts after ("" for the first
// page), checking that its token was issued for filter.
func After(req Request, filter string) (string, error) {
	raw := req.GetPageToken()
	if raw == "" {
		return "", nil
	}
	var t token
	b, err := base64.RawURLEncoding.DecodeString(raw)
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	// Only a token in the exact form this package issues is accepted.
	if err == nil && encode(t) != raw {
		err = errors.New("not in canonical form")
	}
	if err != nil || t.Filter == "" || t.After == "" {
		return "", apierror.InvalidArgument(ReasonPageTokenInvalid,
			"page_token is not a token this list issued; pass the next_page_token of the previous page unchanged, or none for the first page",
			apierror.FieldViolation{Field: "page_token", Description: "not issued by this list"})
	}
	if t.Filter != filter {
		return "", apierror.InvalidArgument(ReasonPageTokenFilterMismatch,
			"page_token was issued for a list with other filters; repeat the filters of the first page, or start again without a token",
			apierror.FieldViolation{Field: "page_token", Description: "issued for other filters"})
	}
	return t.After, nil
}

// Page orders items by key (which must be unique per item) and returns
// the page req asks for, with the token of the next page ("" on the last).
func Page[T any](req Request, filter string, items []T, key func(T) string) ([]T, string, error) {
	size, err := Size(req)
	if err != nil {
		return nil, "", err
	}
	after, err := After(req, filter)
	if err != nil {
		return nil, "", err
	}
	idx := make([]int, len(items))
	ks := make([]string, len(items))
	for i, it := range items {
		ks[i] = key(it)
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return strings.Compare(ks[a], ks[b]) })
	start := 0
	if after != "" {
		start, _ = slices.BinarySearchFunc(idx, after, func(i int, k string) int { return strings.Compare(ks[i], k) })
		if start < len(idx) && ks[idx[start]] == after {
			start++
		}
	}
	end := min(start+size, len(idx))
	page := make([]T, 0, end-start)
	for _, i := range idx[start:end] {
		page = append(page, items[i])
	}
	next := ""
	if end < len(idx) {
		next = encode(token{Filter: filter, After: ks[idx[end-1]]})
	}
	return page, next, nil
}

func encode(t token) string {
	b, _ := json.Marshal(t)
	return base64.RawURLEncoding.EncodeToString(b)
}

// TimeKey is an ordering key for "oldest first, then by id": a fixed-width
// UTC time, so keys sort as the times do.
func TimeKey(t *timestamppb.Timestamp, id string) string {
	return t.AsTime().UTC().Format("20060102T150405.000000000") + "/" + id
}

// NumKey is an ordering key for "by number, then by id" (n ≥ 0).
func NumKey(n int64, id string) string {
	return fmt.Sprintf("%020d/%s", n, id)
}

// Collect calls fetch for every page, from the first, and returns all
// items: for a caller that needs a whole list (e.g. every mapping) from a
// paged API. It stops after MaxPages pages, as a guard against a token
// that never ends.
func Collect[T any](ctx context.Context, fetch func(ctx context.Context, token string) ([]T, string, error)) ([]T, error) {
	var all []T
	tok := ""
	for range MaxPages {
		items, next, err := fetch(ctx, tok)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		tok = next
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("list did not end after %d pages", MaxPages)
}

// MaxPages bounds Collect.
const MaxPages = 10000

// PageAppendOnly is Page for a list that only ever grows at its end and
// is read back in the same order every time (e.g. a task's observations in
// the order they were recorded): an item's position is its key.
func PageAppendOnly[T any](req Request, filter string, items []T) ([]T, string, error) {
	pos := make([]int, len(items))
	for i := range pos {
		pos[i] = i
	}
	page, next, err := Page(req, filter, pos, func(i int) string { return NumKey(int64(i), "") })
	if err != nil {
		return nil, "", err
	}
	out := make([]T, len(page))
	for i, p := range page {
		out[i] = items[p]
	}
	return out, next, nil
}
