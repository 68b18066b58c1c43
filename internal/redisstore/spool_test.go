package redisstore_test

import (
	"testing"

	"github.com/v0m3/v0m3/internal/redisstore"
	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/testkit"
)

func TestSpool(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	c := redistest.Client(t, addr)
	testkit.SpoolConformance(t, redisstore.Spool(c, redisstore.NewKeys("p", "registry"), "audit"),
		redisstore.Spool(c, redisstore.NewKeys("p", "adapter"), "audit"))
}
