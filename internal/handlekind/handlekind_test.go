package handlekind_test

import (
	"testing"

	"github.com/v0m3/v0m3/internal/handlekind"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

func TestKinds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in    registryv1.HandleKind
		of    registryv1.HandleKind
		name  string
		known bool
	}{
		{registryv1.HandleKind_HANDLE_KIND_UNSPECIFIED, registryv1.HandleKind_HANDLE_KIND_SOURCE, "source", true},
		{registryv1.HandleKind_HANDLE_KIND_SOURCE, registryv1.HandleKind_HANDLE_KIND_SOURCE, "source", true},
		{registryv1.HandleKind_HANDLE_KIND_ARTIFACT, registryv1.HandleKind_HANDLE_KIND_ARTIFACT, "artifact", true},
		{registryv1.HandleKind_HANDLE_KIND_DESTINATION, registryv1.HandleKind_HANDLE_KIND_DESTINATION, "destination", true},
		{registryv1.HandleKind(42), registryv1.HandleKind(42), "unknown", false},
	}
	for _, tc := range tests {
		if got := handlekind.Of(tc.in); got != tc.of {
			t.Errorf("Of(%v) = %v, want %v", tc.in, got, tc.of)
		}
		if got := handlekind.Name(tc.in); got != tc.name {
			t.Errorf("Name(%v) = %q, want %q", tc.in, got, tc.name)
		}
		if got := handlekind.Known(tc.in); got != tc.known {
			t.Errorf("Known(%v) = %v, want %v", tc.in, got, tc.known)
		}
	}
}
