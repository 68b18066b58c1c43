// Package handlekind owns the reading of a handle's kind: which of a
// task's scopes a handle is minted from and which handle fields it fills.
package handlekind

import (
	"strings"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Of returns the kind k stands for: an unset kind is a source, because
// handle fields declared before kinds existed were all filled from the
// task's source scope.
func Of(k registryv1.HandleKind) registryv1.HandleKind {
	if k == registryv1.HandleKind_HANDLE_KIND_UNSPECIFIED {
		return registryv1.HandleKind_HANDLE_KIND_SOURCE
	}
	return k
}

// Name is the kind in product words, e.g. "destination", for messages a
// person or a model reads.
func Name(k registryv1.HandleKind) string {
	k = Of(k)
	if _, known := registryv1.HandleKind_name[int32(k)]; !known {
		return "unknown"
	}
	return strings.ToLower(strings.TrimPrefix(k.String(), "HANDLE_KIND_"))
}

// Known reports whether k is a kind this version understands (or unset).
func Known(k registryv1.HandleKind) bool {
	_, ok := registryv1.HandleKind_name[int32(k)]
	return ok
}
