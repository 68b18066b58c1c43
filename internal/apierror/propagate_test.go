package apierror_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
)

// TestPropagate: a downstream status reaches the caller with its code and
// reason; an UNAVAILABLE that says neither why nor when gains
// DEPENDENCY_UNAVAILABLE and one RetryInfo, never INTERNAL; a long
// message is cut; anything else is INTERNAL.
func TestPropagate(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("u", 1<<20)
	for _, tc := range []struct {
		name     string
		err      error
		code     codes.Code
		reason   string
		retry    bool
		same     bool
		maxBytes int
	}{
		{"a dependency that could not be reached", status.Error(codes.Unavailable, "connection refused"), codes.Unavailable, apierror.ReasonDependencyUnavailable, true, false, 64},
		{"wrapped on the way", fmt.Errorf("policy eligibility: %w", status.Error(codes.Unavailable, "connection refused")), codes.Unavailable, apierror.ReasonDependencyUnavailable, true, false, 128},
		{"a store failure downstream keeps its reason", apierror.Store("STORE_FAILURE", "x", fmt.Errorf("dial: %w", errors.New("boom"))), codes.Internal, "STORE_FAILURE", false, true, 64},
		{"an unreachable store downstream keeps its reason and retry", apierror.Unavailable(apierror.ReasonStoreUnavailable, "down", nil), codes.Unavailable, apierror.ReasonStoreUnavailable, true, true, 64},
		{"a refusal passes unchanged", apierror.New(codes.PermissionDenied, "POLICY_DENIED", "no", nil), codes.PermissionDenied, "POLICY_DENIED", false, true, 64},
		{"a long message from downstream is cut", apierror.New(codes.FailedPrecondition, "TASK_NOT_ACTIVE", long, nil), codes.FailedPrecondition, "TASK_NOT_ACTIVE", false, false, 1100},
		{"a bare UNAVAILABLE with a long message", status.Error(codes.Unavailable, long), codes.Unavailable, apierror.ReasonDependencyUnavailable, true, false, 1100},
		{"not a status", errors.New(long), codes.Internal, "", false, false, 1100},
	} {
		got := apierror.Propagate(tc.err, "call")
		if !apierror.Is(got, tc.code, tc.reason) && !(tc.reason == "" && apierror.Code(got) == tc.code) {
			t.Errorf("%s: %v %q, want %v %q", tc.name, apierror.Code(got), apierror.Reason(got), tc.code, tc.reason)
		}
		retries := 0
		for _, d := range status.Convert(got).Details() {
			if _, ok := d.(*errdetails.RetryInfo); ok {
				retries++
			}
		}
		if (retries == 1) != tc.retry || retries > 1 {
			t.Errorf("%s: %d RetryInfo details, want one: %v", tc.name, retries, tc.retry)
		}
		if tc.same && got != tc.err {
			t.Errorf("%s: the error was rebuilt", tc.name)
		}
		if n := len(status.Convert(got).Message()); n > tc.maxBytes {
			t.Errorf("%s: message of %d bytes", tc.name, n)
		}
	}
	if apierror.Propagate(nil, "x") != nil {
		t.Error("nil became an error")
	}
}
