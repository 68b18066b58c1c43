package apierror

import (
	"errors"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
)

func TestWithFieldViolations(t *testing.T) {
	t.Parallel()
	err := WithFieldViolations(New(codes.PermissionDenied, "SCOPE_NOT_AUTHORIZED", "no", map[string]string{"k": "v"}),
		FieldViolation{Field: "source_scope[1].uri", Description: "not authorized"})
	if !Is(err, codes.PermissionDenied, "SCOPE_NOT_AUTHORIZED") || Info(err).GetMetadata()["k"] != "v" ||
		!slices.Equal(Fields(err), []string{"source_scope[1].uri"}) {
		t.Fatalf("got %v, fields %v", err, Fields(err))
	}
	plain := errors.New("plain")
	if got := WithFieldViolations(plain, FieldViolation{Field: "x"}); got != plain {
		t.Fatalf("a non-status error became %v", got)
	}
	if WithFieldViolations(nil) != nil {
		t.Fatal("nil became an error")
	}
}
