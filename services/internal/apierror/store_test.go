package apierror_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/services/internal/apierror"
)

func TestStore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		err    error
		code   codes.Code
		reason string
	}{
		{"connection refused", fmt.Errorf("get task: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}), codes.Unavailable, apierror.ReasonStoreUnavailable},
		{"connection reset", fmt.Errorf("read: %w", syscall.ECONNRESET), codes.Unavailable, apierror.ReasonStoreUnavailable},
		{"deadline", fmt.Errorf("put: %w", context.DeadlineExceeded), codes.Unavailable, apierror.ReasonStoreUnavailable},
		{"a failure the store reported", errors.New("bolt: database not open"), codes.Internal, "STORE_FAILURE"},
		{"a corrupt record", errors.New("proto: cannot parse invalid wire-format data"), codes.Internal, "STORE_FAILURE"},
	} {
		if err := apierror.Store("STORE_FAILURE", "the store failed", tc.err); !apierror.Is(err, tc.code, tc.reason) {
			t.Errorf("%s: %v, want %v %s", tc.name, err, tc.code, tc.reason)
		}
	}
}
