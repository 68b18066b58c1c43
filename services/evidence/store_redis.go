package evidence

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/redisstore"
	"github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// Redis layout, under "{<prefix>:evidence}:". Groups (a source, a task)
// are named by the same digest scope the embedded store uses, so any
// character in a URI or task id is safe in a key.
//
//	obs:<id>            SourceObservation
//	taskobs:<task>      LIST of observation ids, in recording order
//	revs:<source>       HASH content digest -> SourceRevision
//	claim:<id>          ClaimLink
//	trace:<task>        HASH decimal sequence -> TraceEvent
//	traceseq:<task>     last trace sequence of the task
//	tracedelivered:<task> HASH delivery id -> sequence
//	tracetasks          SET of task scopes with a trace
//	receipt:<key>       Receipt
type redisEvidenceStore struct {
	c       redis.UniversalClient
	k       redisstore.Keys
	sources *sourceCache
}

// NewRedisStore returns the evidence Store on Redis; prefix names the
// deployment, so several deployments can share one Redis.
func NewRedisStore(c redis.UniversalClient, prefix string) Store {
	return &redisEvidenceStore{c: c, k: redisstore.NewKeys(prefix, "evidence"), sources: newSourceCache()}
}

// recordObservation writes an observation (KEYS[2], ARGV[5]) and appends
// its id (ARGV[6]) to its task's list (KEYS[3], when given), if the
// source's revisions (KEYS[1]) are as the caller decided on: for the
// content digest ARGV[1], either (ARGV[2] "1") the revision ARGV[3], or
// (ARGV[2] "0") none, with ARGV[3] revisions in all, when the new
// revision ARGV[4] is written too. Otherwise nothing is written and the
// reply is what the caller must decide on: the content's revision (nil
// when none) and the count of revisions. An observation id already
// recorded is refused.
var recordObservation = redis.NewScript(`
if redis.call('EXISTS', KEYS[2]) == 1 then return {'exists'} end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[2] == '1' then
  if cur ~= ARGV[3] then return {'stale', cur, redis.call('HLEN', KEYS[1])} end
else
  local n = redis.call('HLEN', KEYS[1])
  if cur ~= false or n ~= tonumber(ARGV[3]) then return {'stale', cur, n} end
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
end
redis.call('SET', KEYS[2], ARGV[5])
if #KEYS > 2 then redis.call('RPUSH', KEYS[3], ARGV[6]) end
return {'ok'}`)

// maxObservationTries bounds the tries of one observation's write; each
// try after the first decides on the state the previous one found, so
// only a source gaining new content at every try between runs out.
const maxObservationTries = 64

// RecordObservation decides which revision the observation joins or
// starts on what this store last saw of the source (see sourceGuess), and
// writes it in one script that checks that guess: one round trip when it
// holds (the same content again, or a new source), two when the source
// changed meanwhile. Two observations of new content racing for the same
// revision number cannot both win: the second finds the first's
// revision and joins or follows it.
func (r *redisEvidenceStore) RecordObservation(ctx context.Context, obs *evidencev1.SourceObservation, newRevisionID string) (*evidencev1.SourceObservation, error) {
	src := scope(obs.GetConnectionId(), obs.GetResourceUri())
	revsKey := r.k.Key("revs", src)
	keys := []string{revsKey, r.k.Key("obs", obs.GetId())}
	if obs.GetTaskId() != "" {
		keys = append(keys, r.k.Key("taskobs", scope(obs.GetTaskId())))
	}
	digest := obs.GetContentDigest()
	g := r.sources.guess(revsKey, digest)
	for range maxObservationTries {
		joined := &evidencev1.SourceRevision{}
		var newRev []byte
		if g.found {
			if err := redisstore.Unmarshal([]byte(g.revision), joined); err != nil {
				return nil, fmt.Errorf("evidence: record observation: %w", err)
			}
		} else {
			joined = &evidencev1.SourceRevision{
				Id:                 newRevisionID,
				ConnectionId:       obs.GetConnectionId(),
				ResourceUri:        obs.GetResourceUri(),
				Number:             int32(g.count) + 1,
				ContentDigest:      digest,
				FirstObservationId: obs.GetId(),
				FirstSeenTime:      obs.GetRetrieveTime(),
			}
			var err error
			if newRev, err = redisstore.Marshal(joined); err != nil {
				return nil, err
			}
		}
		out := proto.CloneOf(obs)
		out.RevisionId = joined.GetId()
		out.RevisionNumber = joined.GetNumber()
		ob, err := redisstore.Marshal(out)
		if err != nil {
			return nil, err
		}
		args := []any{digest, "0", g.count, newRev, ob, out.GetId()}
		if g.found {
			args[1], args[2] = "1", g.revision
		}
		reply, err := recordObservation.Run(ctx, r.c, keys, args...).Slice()
		if err != nil {
			return nil, fmt.Errorf("evidence: record observation: %w", err)
		}
		switch verdict, _ := reply[0].(string); {
		case verdict == "ok":
			if newRev != nil {
				r.sources.learn(revsKey, digest, string(newRev), g.count+1)
			}
			return out, nil
		case verdict == "exists":
			return nil, fmt.Errorf("evidence: record observation: create observation: %w", store.ErrExists)
		case verdict == "stale" && len(reply) == 3:
			rev, _ := reply[1].(string)
			count, _ := reply[2].(int64)
			g = sourceGuess{revision: rev, found: reply[1] != nil, count: count}
			if g.found {
				r.sources.learn(revsKey, digest, rev, count)
			} else {
				r.sources.learnCount(revsKey, count)
			}
		default:
			return nil, fmt.Errorf("evidence: record observation: unexpected reply %v", reply)
		}
	}
	return nil, fmt.Errorf("evidence: record observation: the revisions of %s kept changing over %d tries", obs.GetResourceUri(), maxObservationTries)
}

func (r *redisEvidenceStore) GetObservation(ctx context.Context, id string) (*evidencev1.SourceObservation, error) {
	obs := &evidencev1.SourceObservation{}
	if err := redisstore.Get(ctx, r.c, r.k.Key("obs", id), obs); err != nil {
		return nil, fmt.Errorf("evidence: get observation: %w", err)
	}
	return obs, nil
}

func (r *redisEvidenceStore) ListObservations(ctx context.Context, taskID string) ([]*evidencev1.SourceObservation, error) {
	task := scope(taskID)
	ids, err := r.c.LRange(ctx, r.k.Key("taskobs", task), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("evidence: list observations: %w", err)
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = r.k.Key("obs", id)
	}
	out, err := redisstore.MGet(ctx, r.c, keys, func() *evidencev1.SourceObservation { return &evidencev1.SourceObservation{} })
	if err != nil {
		return nil, fmt.Errorf("evidence: list observations: %w", err)
	}
	return out, nil
}

func (r *redisEvidenceStore) ListRevisions(ctx context.Context, connectionID, resourceURI string) ([]*evidencev1.SourceRevision, error) {
	src := scope(connectionID, resourceURI)
	all, err := r.c.HGetAll(ctx, r.k.Key("revs", src)).Result()
	if err != nil {
		return nil, fmt.Errorf("evidence: list revisions: %w", err)
	}
	out := make([]*evidencev1.SourceRevision, 0, len(all))
	for _, v := range all {
		rev := newRevision()
		if err := redisstore.Unmarshal([]byte(v), rev); err != nil {
			return nil, err
		}
		out = append(out, rev)
	}
	slices.SortFunc(out, func(a, b *evidencev1.SourceRevision) int { return int(a.GetNumber() - b.GetNumber()) })
	return out, nil
}

func (r *redisEvidenceStore) CreateClaimLink(ctx context.Context, link *evidencev1.ClaimLink) error {
	v, err := redisstore.Marshal(link)
	if err != nil {
		return err
	}
	ok, err := r.c.SetNX(ctx, r.k.Key("claim", link.GetId()), v, 0).Result()
	if err != nil {
		return fmt.Errorf("evidence: create claim link: %w", err)
	}
	if !ok {
		return fmt.Errorf("evidence: create claim link: %w", store.ErrExists)
	}
	return nil
}

// appendTraces assigns each event its task's next sequence and stores it
// under it, all in one step. KEYS are (sequence, trace, delivered)
// triples, one per event, then the set of traced tasks; ARGV are (event,
// task, delivery id) triples. An event whose delivery id the task's trace
// already holds is not stored again: its sequence comes back negated.
// The stored bytes carry no sequence: the hash field is the sequence, and
// readers set it from there.
var appendTraces = redis.NewScript(`
local n = #ARGV / 3
local out = {}
for i = 1, n do
  local id = ARGV[3*i]
  local seen = false
  if id ~= '' then
    seen = redis.call('HGET', KEYS[3*i], id)
  end
  if seen then
    out[i] = -tonumber(seen)
  else
    local seq = redis.call('INCR', KEYS[3*i-2])
    redis.call('HSET', KEYS[3*i-1], seq, ARGV[3*i-2])
    redis.call('SADD', KEYS[3*n+1], ARGV[3*i-1])
    if id ~= '' then
      redis.call('HSET', KEYS[3*i], id, seq)
    end
    out[i] = seq
  end
end
return out
`)

func (r *redisEvidenceStore) AppendTrace(ctx context.Context, ev *evidencev1.TraceEvent) (*evidencev1.TraceEvent, error) {
	out, err := r.AppendTraces(ctx, []*evidencev1.TraceEvent{ev})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

func (r *redisEvidenceStore) AppendTraces(ctx context.Context, evs []*evidencev1.TraceEvent) ([]*evidencev1.TraceEvent, error) {
	out := make([]*evidencev1.TraceEvent, len(evs))
	keys := make([]string, 0, 3*len(evs)+1)
	args := make([]any, 0, 3*len(evs))
	for i, ev := range evs {
		task := scope(ev.GetTaskId())
		out[i] = proto.CloneOf(ev)
		out[i].Sequence = 0
		v, err := redisstore.Marshal(out[i])
		if err != nil {
			return nil, err
		}
		keys = append(keys, r.k.Key("traceseq", task), r.k.Key("trace", task), r.k.Key("tracedelivered", task))
		args = append(args, v, task, ev.GetDeliveryId())
	}
	if len(evs) == 0 {
		return out, nil
	}
	keys = append(keys, r.k.Key("tracetasks"))
	seqs, err := appendTraces.Run(ctx, r.c, keys, args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("evidence: append trace: %w", err)
	}
	if len(seqs) != len(out) {
		return nil, fmt.Errorf("evidence: append trace: %d sequences for %d events", len(seqs), len(out))
	}
	for i, seq := range seqs {
		if seq < 0 {
			// Delivered before: the first one stands.
			if out[i], err = r.traceEvent(ctx, evs[i].GetTaskId(), -seq); err != nil {
				return nil, err
			}
			continue
		}
		out[i].Sequence = seq
	}
	return out, nil
}

// traceEvent reads the event of a task's trace at seq.
func (r *redisEvidenceStore) traceEvent(ctx context.Context, taskID string, seq int64) (*evidencev1.TraceEvent, error) {
	v, err := r.c.HGet(ctx, r.k.Key("trace", scope(taskID)), strconv.FormatInt(seq, 10)).Result()
	if err != nil {
		return nil, fmt.Errorf("evidence: read trace event %d: %w", seq, err)
	}
	ev := newTraceEvent()
	if err := redisstore.Unmarshal([]byte(v), ev); err != nil {
		return nil, err
	}
	ev.Sequence = seq
	return ev, nil
}

// traceEvents decodes a trace hash into events in sequence order.
func traceEvents(all map[string]string) ([]*evidencev1.TraceEvent, error) {
	out := make([]*evidencev1.TraceEvent, 0, len(all))
	for f, v := range all {
		seq, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("trace field %q: %w", f, err)
		}
		ev := newTraceEvent()
		if err := redisstore.Unmarshal([]byte(v), ev); err != nil {
			return nil, err
		}
		ev.Sequence = seq
		out = append(out, ev)
	}
	slices.SortFunc(out, func(a, b *evidencev1.TraceEvent) int { return cmp.Compare(a.Sequence, b.Sequence) })
	return out, nil
}

func (r *redisEvidenceStore) ListTrace(ctx context.Context, taskID string) ([]*evidencev1.TraceEvent, error) {
	task := scope(taskID)
	all, err := r.c.HGetAll(ctx, r.k.Key("trace", task)).Result()
	if err != nil {
		return nil, fmt.Errorf("evidence: list trace: %w", err)
	}
	return traceEvents(all)
}

func (r *redisEvidenceStore) RewriteTrace(ctx context.Context, cutoff time.Time, rewrite func(*evidencev1.TraceEvent) bool) (int, error) {
	changed := 0
	tasksKey := r.k.Key("tracetasks")
	// One transaction over every task's trace, as the contract asks: the
	// set of tasks and each trace are watched, so an event appended while
	// the rewrite computes makes it start over rather than be overwritten.
	err := redisstore.Update(ctx, r.c, func(tx *redis.Tx) error {
		changed = 0
		tasks, err := tx.SMembers(ctx, tasksKey).Result()
		if err != nil {
			return err
		}
		type write struct {
			key, field string
			v          []byte
		}
		var writes []write
		for _, task := range tasks {
			key := r.k.Key("trace", task)
			if err := tx.Watch(ctx, key).Err(); err != nil {
				return err
			}
			all, err := tx.HGetAll(ctx, key).Result()
			if err != nil {
				return err
			}
			events, err := traceEvents(all)
			if err != nil {
				return err
			}
			for _, ev := range events {
				if !ev.GetTime().AsTime().Before(cutoff) {
					continue
				}
				id, taskID, seq := ev.GetId(), ev.GetTaskId(), ev.GetSequence()
				if !rewrite(ev) {
					continue
				}
				ev.Id, ev.TaskId, ev.Sequence = id, taskID, 0
				v, err := redisstore.Marshal(ev)
				if err != nil {
					return err
				}
				writes = append(writes, write{key, strconv.FormatInt(seq, 10), v})
			}
		}
		if len(writes) == 0 {
			return nil
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			for _, w := range writes {
				p.HSet(ctx, w.key, w.field, w.v)
			}
			return nil
		})
		changed = len(writes)
		return err
	}, tasksKey)
	if err != nil {
		return 0, fmt.Errorf("evidence: rewrite trace: %w", err)
	}
	return changed, nil
}

// createReceipt stores a receipt unless its key exists, and returns
// whether it did and the receipt now stored: one atomic step, so two
// concurrent creates of one key return the same receipt.
var createReceipt = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then return {1, ARGV[1]} end
return {0, redis.call('GET', KEYS[1])}
`)

func (r *redisEvidenceStore) CreateReceipt(ctx context.Context, rc *evidencev1.Receipt) (*evidencev1.Receipt, bool, error) {
	v, err := redisstore.Marshal(rc)
	if err != nil {
		return nil, false, err
	}
	res, err := createReceipt.Run(ctx, r.c, []string{r.k.Key("receipt", rc.GetIdempotencyKey())}, v).Slice()
	if err != nil {
		return nil, false, fmt.Errorf("evidence: create receipt: %w", err)
	}
	if len(res) != 2 {
		return nil, false, fmt.Errorf("evidence: create receipt: script returned %d values", len(res))
	}
	created, _ := res[0].(int64)
	b, _ := res[1].(string)
	if created == 1 {
		return proto.CloneOf(rc), true, nil
	}
	stored := &evidencev1.Receipt{}
	if err := redisstore.Unmarshal([]byte(b), stored); err != nil {
		return nil, false, err
	}
	return stored, false, nil
}

func (r *redisEvidenceStore) GetReceipt(ctx context.Context, idempotencyKey string) (*evidencev1.Receipt, error) {
	rc := &evidencev1.Receipt{}
	if err := redisstore.Get(ctx, r.c, r.k.Key("receipt", idempotencyKey), rc); err != nil {
		return nil, fmt.Errorf("evidence: get receipt: %w", err)
	}
	return rc, nil
}

// The audit log: auditseq is the last sequence; audit is a ZSET scored by
// sequence whose members are "<sequence>:<AuditRecord>" (unique, ordered,
// never rewritten); auditreq:<request id> holds the sequence an append
// with that request id stored, kept as long as the record.

// appendAudit appends ARGV[1] to the log, unless KEYS[3] (the request
// id's key, when ARGV[2] is "1") names the sequence of an earlier append:
// then it appends nothing and returns that sequence negated with the
// record's member, so a repeated append costs one round trip and reads
// one record. Otherwise it returns the new sequence alone.
var appendAudit = redis.NewScript(`
if ARGV[2] == '1' then
  local prior = redis.call('GET', KEYS[3])
  if prior then
    local m = redis.call('ZRANGEBYSCORE', KEYS[2], prior, prior)
    return {-tonumber(prior), m[1] or false}
  end
end
local seq = redis.call('INCR', KEYS[1])
redis.call('ZADD', KEYS[2], seq, seq .. ':' .. ARGV[1])
if ARGV[2] == '1' then redis.call('SET', KEYS[3], seq) end
return {seq}
`)

// auditScan is how many records one ListAudit round trip reads.
const auditScan = 256

func (r *redisEvidenceStore) AppendAudit(ctx context.Context, rec *evidencev1.AuditRecord, requestID string) (*evidencev1.AuditRecord, error) {
	out := proto.CloneOf(rec)
	out.Sequence = 0
	v, err := redisstore.Marshal(out)
	if err != nil {
		return nil, err
	}
	once := "0"
	if requestID != "" {
		once = "1"
	}
	res, err := appendAudit.Run(ctx, r.c, []string{r.k.Key("auditseq"), r.k.Key("audit"), r.k.Key("auditreq", requestID)}, v, once).Slice()
	if err != nil {
		return nil, fmt.Errorf("evidence: append audit record: %w", err)
	}
	seq, _ := res[0].(int64)
	if seq < 0 {
		// Appended before under this request id: that record.
		var member string
		if len(res) > 1 {
			member, _ = res[1].(string)
		}
		prior, err := auditMember(member)
		if err != nil || prior.GetSequence() != -seq {
			return nil, fmt.Errorf("evidence: audit record %d of request %q is missing", -seq, requestID)
		}
		return prior, nil
	}
	out.Sequence = seq
	return out, nil
}

// auditMember reads a member of the audit ZSET: "<sequence>:<record>".
func auditMember(m string) (*evidencev1.AuditRecord, error) {
	seq, body, ok := strings.Cut(m, ":")
	n, err := strconv.ParseInt(seq, 10, 64)
	if !ok || err != nil {
		return nil, fmt.Errorf("evidence: audit member without a sequence")
	}
	rec := newAuditRecord()
	if err := redisstore.Unmarshal([]byte(body), rec); err != nil {
		return nil, err
	}
	rec.Sequence = n
	return rec, nil
}

func (r *redisEvidenceStore) ListAudit(ctx context.Context, after int64, limit int, match func(*evidencev1.AuditRecord) bool) ([]*evidencev1.AuditRecord, error) {
	var out []*evidencev1.AuditRecord
	for len(out) < limit {
		members, err := r.c.ZRangeByScore(ctx, r.k.Key("audit"), &redis.ZRangeBy{
			Min: "(" + strconv.FormatInt(after, 10), Max: "+inf", Count: auditScan,
		}).Result()
		if err != nil {
			return nil, fmt.Errorf("evidence: list audit records: %w", err)
		}
		for _, m := range members {
			rec, err := auditMember(m)
			if err != nil {
				return nil, err
			}
			after = rec.GetSequence()
			if match(rec) {
				out = append(out, rec)
				if len(out) == limit {
					break
				}
			}
		}
		if len(members) < auditScan {
			break
		}
	}
	return out, nil
}
