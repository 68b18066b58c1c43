package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client returns a go-redis client for addr, closed when t ends. Timeouts
// are short so a test against a stopped server fails fast instead of
// hanging.
func Client(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:         addr,
		DialTimeout:  time.Second,
		ReadTimeout:  2 * time.Second,
		WriteTimeout: 2 * time.Second,
		PoolSize:     64,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a deployment prefix unique to this call, so tests sharing
// one server never see each other's keys.
func Prefix(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := strings.NewReplacer("/", "_", " ", "_", "{", "_", "}", "_").Replace(t.Name())
	return name + "-" + hex.EncodeToString(b[:])
}

// RoundTrips is a go-redis hook counting what a client sends: one per
// command or pipeline (a MULTI/EXEC is one). Add it with AddHook.
type RoundTrips struct{ n atomic.Int64 }

// Count is the round trips made so far.
func (r *RoundTrips) Count() int64 { return r.n.Load() }

// DialHook leaves dialing as it is.
func (r *RoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts a command.
func (r *RoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.n.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts a pipeline.
func (r *RoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.n.Add(1)
		return next(ctx, cmds)
	}
}
