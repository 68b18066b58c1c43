package redistest

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
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
