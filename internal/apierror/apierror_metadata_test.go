package apierror_test

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
)

func TestWithMetadata(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		err        error
		fallback   string
		wantCode   codes.Code
		wantReason string
		wantMeta   map[string]string
		wantFields []string
	}{
		{"adds to existing info", apierror.New(codes.PermissionDenied, "POLICY_DENIED", "no", map[string]string{"policy_revision": "r1"}), "X",
			codes.PermissionDenied, "POLICY_DENIED", map[string]string{"policy_revision": "r1", "request_id": "req_1"}, nil},
		{"keeps a key already set", apierror.New(codes.FailedPrecondition, "APPROVAL_INVALIDATED", "no", map[string]string{"request_id": "req_0"}), "X",
			codes.FailedPrecondition, "APPROVAL_INVALIDATED", map[string]string{"request_id": "req_0"}, nil},
		{"keeps bad request fields", apierror.InvalidArgument("FIELD_INVALID", "bad", apierror.FieldViolation{Field: "x", Description: "d"}), "X",
			codes.InvalidArgument, "FIELD_INVALID", map[string]string{"request_id": "req_1"}, []string{"x"}},
		{"adds info with the fallback", status.Error(codes.Unavailable, "down"), "DEPENDENCY_UNAVAILABLE",
			codes.Unavailable, "DEPENDENCY_UNAVAILABLE", map[string]string{"request_id": "req_1"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := apierror.WithMetadata(tc.err, tc.fallback, "request_id", "req_1")
			if apierror.Code(got) != tc.wantCode || apierror.Reason(got) != tc.wantReason {
				t.Fatalf("got %v %q, want %v %q", apierror.Code(got), apierror.Reason(got), tc.wantCode, tc.wantReason)
			}
			if status.Convert(got).Message() != status.Convert(tc.err).Message() {
				t.Errorf("message changed: %q", status.Convert(got).Message())
			}
			md := apierror.Info(got).GetMetadata()
			for k, v := range tc.wantMeta {
				if md[k] != v {
					t.Errorf("metadata %s = %q, want %q (all %v)", k, md[k], v, md)
				}
			}
			if f := apierror.Fields(got); len(f) != len(tc.wantFields) {
				t.Errorf("fields %v, want %v", f, tc.wantFields)
			}
		})
	}
	if apierror.WithMetadata(nil, "X", "a", "b") != nil {
		t.Error("nil became an error")
	}
	plain := status.Error(codes.Internal, "x")
	if got := apierror.WithMetadata(plain, "", "a", "b"); apierror.Info(got) != nil {
		t.Error("no fallback reason, yet an ErrorInfo was added")
	}
}
