package redisstore_test

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/v0m3/v0m3/internal/redisstore"
	"github.com/v0m3/v0m3/internal/redistest"
)

// bumpScript stands for a service's script queued inside a transaction
// (the orchestrator's outbox): it takes the next number of KEYS[1] and
// returns it with ARGV[1].
const bumpScript = `
local n = redis.call('INCR', KEYS[1])
return {n, ARGV[1]}
`

// increment is a decide that adds one to the number at vals[0] (absent is
// 0), appends it to a list and runs bumpScript, reporting what it saw and
// the replies it got.
func increment(ctx context.Context, key string, seen *[]int, replies func(push *redis.IntCmd, bump *redis.Cmd)) func(redis.Cmdable, []any) (redisstore.Write, error) {
	bump := redis.NewScript(bumpScript)
	return func(_ redis.Cmdable, vals []any) (redisstore.Write, error) {
		n := 0
		if s, ok := vals[0].(string); ok {
			var err error
			if n, err = strconv.Atoi(s); err != nil {
				return nil, err
			}
		}
		*seen = append(*seen, n)
		return func(p redis.Pipeliner) error {
			p.Set(ctx, key, strconv.Itoa(n+1), 0)
			push := p.RPush(ctx, key+":log", n+1)
			b := bump.Eval(ctx, p, []string{key + ":bumps"}, "x")
			if replies != nil {
				replies(push, b)
			}
			return nil
		}, nil
	}
}

// A transaction on values the Speculator remembers commits in one round
// trip, with every command's reply handed back (an IntCmd's, a queued
// script's); one whose remembered value another client changed decides
// again on the fresh value, and nothing is lost or applied twice; a wrong
// expectation of absence costs a retry, not a wrong write.
func TestSpeculatorOneRoundTrip(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	ctx := context.Background()
	c := redistest.Client(t, addr)
	rt := &redistest.RoundTrips{}
	c.AddHook(rt)
	other := redistest.Client(t, addr)
	key := redisstore.NewKeys(redistest.Prefix(t), "test").Key("n")
	sp := redisstore.NewSpeculator(c, 16, bumpScript)

	var seen []int
	update := func(replies func(*redis.IntCmd, *redis.Cmd)) int64 {
		t.Helper()
		before := rt.Count()
		if err := sp.Update(ctx, []string{key}, increment(ctx, key, &seen, replies)); err != nil {
			t.Fatalf("update: %v", err)
		}
		return rt.Count() - before
	}
	update(nil) // nothing remembered: WATCH and read, then MULTI/EXEC
	update(nil) // the script is loaded on first use
	var (
		push *redis.IntCmd
		bump *redis.Cmd
	)
	if n := update(func(p *redis.IntCmd, b *redis.Cmd) { push, bump = p, b }); n != 1 {
		t.Errorf("update on remembered values took %d round trips, want 1", n)
	}
	if push.Val() != 3 || push.Err() != nil {
		t.Errorf("RPUSH reply = %d, %v; want 3", push.Val(), push.Err())
	}
	if got, err := bump.Slice(); err != nil || len(got) != 2 || got[0] != int64(3) || got[1] != "x" {
		t.Errorf("queued script's reply = %v, %v; want [3 x]", got, err)
	}

	// Another client moves the number on: the remembered 3 is stale.
	if err := other.Set(ctx, key, "10", 0).Err(); err != nil {
		t.Fatal(err)
	}
	seen = nil
	update(nil)
	if len(seen) != 2 || seen[0] != 3 || seen[1] != 10 {
		t.Errorf("after another client's write decide saw %v, want [3 10] (the remembered value, then the stored one)", seen)
	}
	if got, _ := other.Get(ctx, key).Result(); got != "11" {
		t.Errorf("stored %s, want 11", got)
	}
	if got, _ := other.LLen(ctx, key+":log").Result(); got != 4 {
		t.Errorf("log holds %d entries, want 4: a write that lost its check must write nothing", got)
	}

	// A key expected absent that exists.
	sp.Expect(key, nil)
	seen = nil
	update(nil)
	if len(seen) != 2 || seen[0] != 0 || seen[1] != 11 {
		t.Errorf("on a wrong expectation of absence decide saw %v, want [0 11]", seen)
	}
	if got, _ := other.Get(ctx, key).Result(); got != "12" {
		t.Errorf("stored %s, want 12", got)
	}
}

// Two replicas, each with its own Speculator, incrementing one number
// concurrently lose no increment and apply none twice.
func TestSpeculatorConcurrentReplicas(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	ctx := context.Background()
	key := redisstore.NewKeys(redistest.Prefix(t), "test").Key("n")
	const replicas, workers, each = 2, 4, 50
	var wg sync.WaitGroup
	for range replicas {
		sp := redisstore.NewSpeculator(redistest.Client(t, addr), 16, bumpScript)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					var seen []int
					if err := sp.Update(ctx, []string{key}, increment(ctx, key, &seen, nil)); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	c := redistest.Client(t, addr)
	const want = replicas * workers * each
	if got, _ := c.Get(ctx, key).Result(); got != strconv.Itoa(want) {
		t.Errorf("number = %s, want %d", got, want)
	}
	if got, _ := c.LLen(ctx, key+":log").Result(); got != want {
		t.Errorf("log holds %d entries, want %d", got, want)
	}
	if got, _ := c.Get(ctx, key+":bumps").Result(); got != strconv.Itoa(want) {
		t.Errorf("queued script ran %s times, want %d", got, want)
	}
}

// A command that fails inside a one-round-trip write fails alone, as in
// MULTI/EXEC: its error is its reply, and the other writes are made.
func TestSpeculatorFailedCommandFailsAlone(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	ctx := context.Background()
	c := redistest.Client(t, addr)
	keys := redisstore.NewKeys(redistest.Prefix(t), "test")
	key, text := keys.Key("n"), keys.Key("text")
	if err := c.Set(ctx, text, "not a number", 0).Err(); err != nil {
		t.Fatal(err)
	}
	sp := redisstore.NewSpeculator(c, 16)
	sp.Expect(key, nil)
	var incr *redis.IntCmd
	if err := sp.Update(ctx, []string{key}, func(_ redis.Cmdable, vals []any) (redisstore.Write, error) {
		if vals[0] != nil {
			t.Errorf("decided on %v, want the expected absence", vals[0])
		}
		return func(p redis.Pipeliner) error {
			incr = p.Incr(ctx, text)
			p.Set(ctx, key, "1", 0)
			return nil
		}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if incr.Err() == nil {
		t.Errorf("INCR of a non-number = %d, want its error", incr.Val())
	}
	if got, _ := c.Get(ctx, key).Result(); got != "1" {
		t.Errorf("stored %q, want the other write made", got)
	}
}
