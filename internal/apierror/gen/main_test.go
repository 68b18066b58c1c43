package main

import (
	"bytes"
	"os"
	"testing"
)

// TestTheReferencePageIsUpToDate fails when docs/reference/errors.md is
// not what the catalogue generates: someone changed errors.proto without
// running make generate, or edited the page by hand.
func TestTheReferencePageIsUpToDate(t *testing.T) {
	want, err := render("../../../proto")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../../docs/reference/errors.md")
	if err != nil {
		t.Fatalf("%v; run make generate", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("docs/reference/errors.md is out of date; run make generate (or go run ./internal/apierror/gen) and commit it")
	}
	for _, r := range []string{"`FIELD_REQUIRED`", "`MAPPING_UNKNOWN`", "`TOKEN_EXPIRED`"} {
		if !bytes.Contains(want, []byte(r)) {
			t.Errorf("the page does not list %s", r)
		}
	}
}
