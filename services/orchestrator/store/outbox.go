package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	kv "github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// OutboxEntry is one trace event waiting in the outbox, under the key
// that orders it.
type OutboxEntry struct {
	Key   string
	Event *evidencev1.TraceEvent
	// Claimant is the replica that delivers the entry while its claim
	// lasts (see OutboxClaim); empty when any replica may.
	Claimant string
}

// OutboxClaim is what a replica writing trace events to the outbox with
// a state change says of their delivery: it delivers them itself (its
// call does, right after the write), so another replica's outbox loop
// leaves them, and every entry after them, alone until ttl from the
// write, by the store's clock (see Server.claimTTL). Without it two replicas sent one event
// twice. A claim that lapsed (its replica stopped) lets any deliver. A
// store used by one process at a time (bbolt) need not keep claims: the
// process knows what its calls deliver.
type OutboxClaim struct {
	Owner string
	TTL   time.Duration
}

// TraceOutbox holds, in the orchestrator's own store, the trace events
// the evidence service could not take, until they are delivered.
type TraceOutbox interface {
	// PutTraceOutbox appends events after every one already held, in
	// order.
	PutTraceOutbox(ctx context.Context, evs []*evidencev1.TraceEvent) error
	// ListTraceOutbox returns up to limit of the oldest entries, oldest
	// first.
	ListTraceOutbox(ctx context.Context, limit int) ([]OutboxEntry, error)
	// DeleteTraceOutbox removes delivered entries by key.
	DeleteTraceOutbox(ctx context.Context, keys []string) error
}

const bucketTraceOutbox = "trace_outbox" // seq key -> TraceEvent, waiting for delivery

func (b *boltStore) PutTraceOutbox(_ context.Context, evs []*evidencev1.TraceEvent) error {
	return b.db.Batch(func(tx *kv.Tx) error {
		_, err := putOutbox(tx, evs)
		return err
	})
}

// putOutbox appends evs to the outbox inside tx and returns their entries.
func putOutbox(tx *kv.Tx, evs []*evidencev1.TraceEvent) ([]OutboxEntry, error) {
	out := make([]OutboxEntry, 0, len(evs))
	for _, ev := range evs {
		n, err := tx.NextSequence(bucketTraceOutbox)
		if err != nil {
			return nil, fmt.Errorf("trace outbox sequence: %w", err)
		}
		key := kv.SeqKey(n)
		if err := tx.Put(bucketTraceOutbox, key, ev); err != nil {
			return nil, fmt.Errorf("put trace outbox entry: %w", err)
		}
		out = append(out, OutboxEntry{Key: key, Event: ev})
	}
	return out, nil
}

var errOutboxFull = errors.New("limit reached")

func (b *boltStore) ListTraceOutbox(_ context.Context, limit int) ([]OutboxEntry, error) {
	var out []OutboxEntry
	err := b.db.View(func(tx *kv.Tx) error {
		return kv.List(tx, bucketTraceOutbox, "", func() *evidencev1.TraceEvent { return &evidencev1.TraceEvent{} },
			func(key string, ev *evidencev1.TraceEvent) error {
				if len(out) >= limit {
					return errOutboxFull
				}
				out = append(out, OutboxEntry{Key: key, Event: ev})
				return nil
			})
	})
	if err != nil && !errors.Is(err, errOutboxFull) {
		return nil, fmt.Errorf("list trace outbox: %w", err)
	}
	return out, nil
}

// DeleteTraceOutbox shares its commit with concurrent writes: every
// governed call deletes what it delivered, twice.
func (b *boltStore) DeleteTraceOutbox(_ context.Context, keys []string) error {
	return b.db.Batch(func(tx *kv.Tx) error { return deleteOutbox(tx, keys) })
}

// OutboxKeys returns the keys of entries.
func OutboxKeys(entries []OutboxEntry) []string {
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = e.Key
	}
	return keys
}

// deleteOutbox deletes the outbox entries of keys in tx; one gone already
// is no error.
func deleteOutbox(tx *kv.Tx, keys []string) error {
	for _, k := range keys {
		if err := tx.Delete(bucketTraceOutbox, k); err != nil && !errors.Is(err, kv.ErrNotFound) {
			return fmt.Errorf("delete trace outbox entry: %w", err)
		}
	}
	return nil
}

// On Redis the outbox is a sorted set scored by a counter; each member is
// "<20-digit seq>:<event bytes>", so members are unique and ordered.
func (s *redisOrchestratorStore) PutTraceOutbox(ctx context.Context, evs []*evidencev1.TraceEvent) error {
	_, err := s.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		_, err := s.queueOutbox(ctx, p, evs, OutboxClaim{})
		return err
	})
	if err != nil {
		return fmt.Errorf("put trace outbox entries: %w", err)
	}
	return nil
}

// putOutboxScript appends its arguments after the first two (marshalled
// trace events) to the outbox, each under the next sequence, claimed for
// ARGV[1] (when not empty) for ARGV[2] ms, and returns the members: run
// inside a MULTI, the sequence is taken in the same atomic step as the
// state change it goes with. A claim is a key, KEYS[3] followed by the
// entry's sequence, that expires with it.
var putOutboxScript = redis.NewScript(putOutboxSource)

// putOutboxSource is putOutboxScript's source, which the store's
// one-round-trip transactions run too (redisstore.NewSpeculator).
const putOutboxSource = `
local members = {}
for i = 3, #ARGV do
  local seq = redis.call('INCR', KEYS[1])
  local s = string.format('%020d', seq)
  local m = s .. ':' .. ARGV[i]
  redis.call('ZADD', KEYS[2], seq, m)
  if ARGV[1] ~= '' then
    redis.call('SET', KEYS[3] .. s, ARGV[1], 'PX', ARGV[2])
  end
  members[i - 2] = m
end
return members
`

// listOutboxScript returns up to ARGV[1] of the oldest outbox members,
// each followed by its claimant ("" when unclaimed).
var listOutboxScript = redis.NewScript(`
local out = {}
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)) do
  out[#out + 1] = m
  out[#out + 1] = redis.call('GET', KEYS[2] .. string.sub(m, 1, 20)) or ''
end
return out
`)

// claimKey is the prefix of the outbox's claim keys; an entry's claim is
// under the prefix followed by the entry's sequence (its key's first 20
// characters).
func (s *redisOrchestratorStore) claimKey() string { return s.k.Key("trace_outbox_claim", "") }

// queueOutbox queues the putting of evs in the outbox on p and returns
// what gives their entries once p has run.
func (s *redisOrchestratorStore) queueOutbox(ctx context.Context, p redis.Pipeliner, evs []*evidencev1.TraceEvent, claim OutboxClaim) (func() []OutboxEntry, error) {
	if len(evs) == 0 {
		return func() []OutboxEntry { return nil }, nil
	}
	args := make([]any, 2, len(evs)+2)
	args[0], args[1] = claim.Owner, max(claim.TTL.Milliseconds(), 1)
	for _, ev := range evs {
		b, err := proto.Marshal(ev)
		if err != nil {
			return nil, err
		}
		args = append(args, b)
	}
	// EVAL, not EVALSHA: inside MULTI a missing script cannot be retried.
	cmd := putOutboxScript.Eval(ctx, p, []string{s.k.Key("trace_outbox_seq"), s.k.Key("trace_outbox"), s.claimKey()}, args...)
	return func() []OutboxEntry {
		members, _ := cmd.StringSlice()
		out := make([]OutboxEntry, 0, len(members))
		for i, m := range members {
			if i < len(evs) {
				out = append(out, OutboxEntry{Key: m, Event: evs[i], Claimant: claim.Owner})
			}
		}
		return out
	}, nil
}

func (s *redisOrchestratorStore) ListTraceOutbox(ctx context.Context, limit int) ([]OutboxEntry, error) {
	vals, err := listOutboxScript.Run(ctx, s.c, []string{s.k.Key("trace_outbox"), s.claimKey()}, limit).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("list trace outbox: %w", err)
	}
	out := make([]OutboxEntry, 0, len(vals)/2)
	for i := 0; i+1 < len(vals); i += 2 {
		m := vals[i]
		seq, raw, ok := strings.Cut(m, ":")
		if _, err := strconv.ParseInt(seq, 10, 64); !ok || err != nil {
			return nil, fmt.Errorf("trace outbox: malformed entry")
		}
		ev := &evidencev1.TraceEvent{}
		if err := proto.Unmarshal([]byte(raw), ev); err != nil {
			return nil, fmt.Errorf("trace outbox entry %s: %w", seq, err)
		}
		out = append(out, OutboxEntry{Key: m, Event: ev, Claimant: vals[i+1]})
	}
	return out, nil
}

func (s *redisOrchestratorStore) DeleteTraceOutbox(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	_, err := s.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		s.queueDeleteOutbox(ctx, p, keys)
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete trace outbox entries: %w", err)
	}
	return nil
}

// queueDeleteOutbox queues on p the deletes of the outbox entries of keys
// (members of the sorted set) and of their claims.
func (s *redisOrchestratorStore) queueDeleteOutbox(ctx context.Context, p redis.Pipeliner, keys []string) {
	if len(keys) == 0 {
		return
	}
	members := make([]any, len(keys))
	claims := make([]string, 0, len(keys))
	for i, k := range keys {
		members[i] = k
		if seq, _, ok := strings.Cut(k, ":"); ok {
			claims = append(claims, s.claimKey()+seq)
		}
	}
	p.ZRem(ctx, s.k.Key("trace_outbox"), members...)
	if len(claims) > 0 {
		p.Del(ctx, claims...)
	}
}
