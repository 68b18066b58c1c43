package apierror_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	bolterrors "go.etcd.io/bbolt/errors"
	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
)

// redisReply is an error reply as go-redis returns it (redis.Error).
type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}

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
		{"redis at maxmemory", fmt.Errorf("create request: %w", redisReply("OOM command not allowed when used memory > 'maxmemory'.")), codes.ResourceExhausted, apierror.ReasonStoreFull},
		{"a transaction redis aborted at maxmemory", errors.Join(redisReply("EXECABORT Transaction discarded because of previous errors."), redisReply("OOM command not allowed when used memory > 'maxmemory'.")), codes.ResourceExhausted, apierror.ReasonStoreFull},
		{"redis loading its data set", fmt.Errorf("get task: %w", redisReply("LOADING Redis is loading the dataset in memory")), codes.Unavailable, apierror.ReasonStoreUnavailable},
		{"redis busy with a script", redisReply("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."), codes.Unavailable, apierror.ReasonStoreUnavailable},
		{"a replica cut off from its master", redisReply("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), codes.Unavailable, apierror.ReasonStoreUnavailable},
		{"a write to a replica", redisReply("READONLY You can't write against a read only replica."), codes.Unavailable, apierror.ReasonStoreUnavailable},
		{"a cluster failing over", errors.Join(redisReply("EXECABORT Transaction discarded because of previous errors."), redisReply("TRYAGAIN Multiple keys request during rehashing of slot")), codes.Unavailable, apierror.ReasonStoreUnavailable},
		{"redis at its client limit", redisReply("ERR max number of clients reached"), codes.Unavailable, apierror.ReasonStoreUnavailable},
		{"a cluster down", redisReply("CLUSTERDOWN The cluster is down"), codes.Unavailable, apierror.ReasonStoreUnavailable},
		{"the embedded store's lock not taken in time", fmt.Errorf("open policy.db: %w", bolterrors.ErrTimeout), codes.Unavailable, apierror.ReasonStoreUnavailable},
		{"another redis error reply", redisReply("WRONGTYPE Operation against a key holding the wrong kind of value"), codes.Internal, "STORE_FAILURE"},
		{"a disk full", fmt.Errorf("bolt commit: %w", &os.PathError{Op: "write", Path: "/data/policy.db", Err: syscall.ENOSPC}), codes.ResourceExhausted, apierror.ReasonStoreFull},
		{"a disk quota", fmt.Errorf("fdatasync: %w", syscall.EDQUOT), codes.ResourceExhausted, apierror.ReasonStoreFull},
	} {
		if err := apierror.Store("STORE_FAILURE", "the store failed", tc.err); !apierror.Is(err, tc.code, tc.reason) {
			t.Errorf("%s: %v, want %v %s", tc.name, err, tc.code, tc.reason)
		}
	}
}
