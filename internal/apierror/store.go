package apierror

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	bolterrors "go.etcd.io/bbolt/errors"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ReasonStoreUnavailable is the reason of a call that failed because the
// service's store could not be reached (e.g. Redis down): retrying later
// may succeed, so it is UNAVAILABLE with a RetryInfo, not INTERNAL.
const ReasonStoreUnavailable = "STORE_UNAVAILABLE"

// ReasonStoreFull is the reason of a call that failed because the
// service's store refused the write for lack of room: Redis at its
// maxmemory (which V0M3 requires to evict nothing), or the disk of the
// embedded store full. Nothing was written; retrying helps only once
// room is made, so it is RESOURCE_EXHAUSTED without a RetryInfo.
const ReasonStoreFull = "STORE_FULL"

// ReasonDependencyUnavailable is the reason of a call that failed because
// a service it depends on could not be reached (its gRPC status was
// UNAVAILABLE without a reason of its own).
const ReasonDependencyUnavailable = "DEPENDENCY_UNAVAILABLE"

// retryDelay is the RetryInfo delay of an unreachable store or
// dependency.
const retryDelay = time.Second

// Store returns the error of a failed store operation: UNAVAILABLE
// STORE_UNAVAILABLE with a RetryInfo when the store could not be reached
// (a network error, a refused or reset connection, a deadline) or said
// it cannot serve for the moment (see transient), RESOURCE_EXHAUSTED STORE_FULL when it had no room for the write,
// otherwise INTERNAL with reason and msg. The store's own error is never
// in the message: the caller logs it.
func Store(reason, msg string, err error) error {
	checkReason(reason)
	switch {
	case full(err):
		return New(codes.ResourceExhausted, ReasonStoreFull, msg+
			": the store is full (Redis reached its maxmemory, or the embedded store's disk is out of space) and nothing was written; make room (raise maxmemory, grow the volume) and retry", nil)
	case unreachable(err):
		return Unavailable(ReasonStoreUnavailable, fmt.Sprintf("%s: the store is unreachable; retry in %s", msg, retryDelay), nil)
	case transient(err):
		return Unavailable(ReasonStoreUnavailable, fmt.Sprintf("%s: the store cannot serve for the moment (loading its data, busy, or failing over); retry in %s", msg, retryDelay), nil)
	}
	return New(codes.Internal, reason, msg, nil)
}

// redisError is what go-redis's error replies implement (redis.Error),
// named here so this package needs no Redis client.
type redisError interface {
	error
	RedisError()
}

// full reports whether err says the store had no room for a write: a
// Redis OOM reply (the command, script or transaction was refused whole)
// or a full disk or quota.
func full(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || redisReply(err, "OOM ")
}

// transientReplies are the Redis error replies that say the server cannot
// serve for the moment but will: it is loading its data set after a
// restart (LOADING), a script runs past its time limit (BUSY), or it is a
// replica cut off from its master or one being failed over (MASTERDOWN,
// READONLY, TRYAGAIN, CLUSTERDOWN), or its client limit is reached.
// Nothing was done, so the call may be
// retried with the same request id.
var transientReplies = []string{"LOADING ", "BUSY ", "MASTERDOWN ", "READONLY ", "TRYAGAIN ", "CLUSTERDOWN ", "ERR max number of clients reached"}

// transient reports whether err says the store will serve again shortly:
// one of transientReplies, or the embedded store's file lock not taken
// within its timeout (another process holds it, e.g. the previous
// instance still stopping).
func transient(err error) bool {
	return errors.Is(err, bolterrors.ErrTimeout) || redisReply(err, transientReplies...)
}

// redisReply reports whether any error in err's tree is a Redis error
// reply starting with one of prefixes (errors.As would stop at the first
// reply, e.g. an EXECABORT joined with its reason).
func redisReply(err error, prefixes ...string) bool {
	if re, ok := err.(redisError); ok {
		for _, p := range prefixes {
			if strings.HasPrefix(re.Error(), p) {
				return true
			}
		}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return redisReply(u.Unwrap(), prefixes...)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if redisReply(e, prefixes...) {
				return true
			}
		}
	}
	return false
}

// Unavailable returns UNAVAILABLE with an ErrorInfo (reason, metadata) and
// a RetryInfo: what failed may succeed when retried a little later.
func Unavailable(reason, msg string, metadata map[string]string) error {
	checkReason(reason)
	st := status.New(codes.Unavailable, msg)
	if d, derr := st.WithDetails(
		&errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: metadata},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelay)},
	); derr == nil {
		st = d
	}
	return st.Err()
}

// RetryDelay returns the RetryInfo delay of err, or 0 when it has none.
func RetryDelay(err error) time.Duration {
	st, ok := status.FromError(err)
	if !ok {
		return 0
	}
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			return r.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// unreachable reports whether err says the store could not be reached,
// rather than that it answered with a failure.
func unreachable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded)
}
