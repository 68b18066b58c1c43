package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/redisstore"
	kv "github.com/v0m3/v0m3/internal/store"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// Redis layout, under "{<prefix>:orchestrator}:":
//
//	task:<id>            Task
//	tasks                SET of task ids
//	catalogue:<task>     OfferedCatalogue
//	req:<id>             ToolRequest
//	reqkey:<digest>      request id, for digest of (task id, provider call id)
//	taskreqs:<task>      LIST of request ids, oldest first
//	open                 SET of request ids with an attempt that has no end time
//	unsettled            SET of request ids recovery has work for (see recoverable)
//	lease:<id>           owner of the request's lease, expiring with it (PX)
//	leasegen:<id>        generation of the request's newest lease (see Fence),
//	                     expiring leaseGenerationTTL after the lease's last renewal
//	leasegen_seq         counter the generations of every request are taken from
//	events:<task>        LIST of TaskEvents; the event at index i has sequence i+1
//	tokens:<task>        TaskAccessTokens (digests of the task's MCP tokens)
//	eventsig:<task>      pub/sub channel: a message per appended event, to
//	                     wake WatchTask streams on every replica (FollowEvents)
//
// Changes that decide on stored state are WATCH/MULTI/EXEC transactions
// retried on conflict, so two replicas receiving the same provider call at
// once create one request, and an approval is used once. Those that
// decide on records this replica last wrote or read (a request moving
// through its stages) are sent in one round trip (redisstore.Speculator).
type redisOrchestratorStore struct {
	c    redis.UniversalClient
	k    redisstore.Keys
	spec *redisstore.Speculator
}

// rememberedRecords bounds the records the store remembers for one-round
// -trip transactions: the requests, tasks and lease generations of a few
// hundred calls in flight (a request is a few KB; a settled one is never
// written again and ages out).
const rememberedRecords = 1024

// NewRedisStore returns the orchestrator Store on Redis; prefix names the
// deployment, so several deployments can share one Redis.
func NewRedisStore(c redis.UniversalClient, prefix string) Store {
	return &redisOrchestratorStore{c: c, k: redisstore.NewKeys(prefix, "orchestrator"),
		spec: redisstore.NewSpeculator(c, rememberedRecords, putOutboxSource, acquireLeaseSource)}
}

func (s *redisOrchestratorStore) task(id string) string { return s.k.Key("task", id) }
func (s *redisOrchestratorStore) req(id string) string  { return s.k.Key("req", id) }

func (s *redisOrchestratorStore) CreateTask(ctx context.Context, t *orchestratorv1.Task) error {
	v, err := redisstore.Marshal(t)
	if err != nil {
		return err
	}
	err = redisstore.Update(ctx, s.c, func(tx *redis.Tx) error {
		n, err := tx.Exists(ctx, s.task(t.GetId())).Result()
		if err != nil {
			return err
		}
		if n > 0 {
			return redisstore.Abort(ctx, tx, fmt.Errorf("create task %s: %w", t.GetId(), kv.ErrExists))
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, s.task(t.GetId()), v, 0)
			p.SAdd(ctx, s.k.Key("tasks"), t.GetId())
			return nil
		})
		return err
	}, s.task(t.GetId()))
	return err
}

func (s *redisOrchestratorStore) GetTask(ctx context.Context, id string) (*orchestratorv1.Task, error) {
	t := &orchestratorv1.Task{}
	if err := redisstore.Get(ctx, s.c, s.task(id), t); err != nil {
		return nil, fmt.Errorf("get task %s: %w", id, err)
	}
	return t, nil
}

func (s *redisOrchestratorStore) UpdateTask(ctx context.Context, id string, fn func(*orchestratorv1.Task) error) (*orchestratorv1.Task, error) {
	out, _, err := s.UpdateTaskEmit(ctx, id, fn, Held{})
	return out, err
}

func (s *redisOrchestratorStore) UpdateTaskEmit(ctx context.Context, id string, fn func(*orchestratorv1.Task) error, held Held) (*orchestratorv1.Task, Written, error) {
	if held.Task != nil {
		return nil, Written{}, errTaskChangeHeld
	}
	var out *orchestratorv1.Task
	w, err := s.update(ctx, held, []string{s.task(id)}, func(_ redis.Cmdable, vals []any) (redisstore.Write, error) {
		t := &orchestratorv1.Task{}
		if err := redisstore.Decode(vals[0], t); err != nil {
			return nil, fmt.Errorf("get task %s: %w", id, err)
		}
		if err := fn(t); err != nil {
			return nil, err
		}
		v, err := redisstore.Marshal(t)
		if err != nil {
			return nil, err
		}
		out = t
		return func(p redis.Pipeliner) error {
			p.Set(ctx, s.task(id), v, 0)
			return nil
		}, nil
	})
	if err != nil {
		return nil, Written{}, err
	}
	return out, w, nil
}

func (s *redisOrchestratorStore) EmitHeld(ctx context.Context, held Held) (Written, error) {
	if held.Fence.Generation == 0 && held.Task == nil {
		// Nothing to decide on: no WATCH.
		var queued func() Written
		if _, err := s.c.TxPipelined(ctx, func(p redis.Pipeliner) (err error) {
			queued, err = s.queueHeld(ctx, p, held)
			return err
		}); err != nil {
			return Written{}, err
		}
		return queued(), nil
	}
	return s.update(ctx, held, nil, func(redis.Cmdable, []any) (redisstore.Write, error) {
		return func(redis.Pipeliner) error { return nil }, nil
	})
}

// update runs an optimistic transaction (redisstore.Speculator.Update) on
// keys, the task held.Task changes and, when held is fenced, the lease
// generation the fence is checked against, all read (or remembered) and
// checked together: a lease taken between the read and the write fails
// the write, and the retried transaction sees it. A stale fence refuses
// the change with ErrFenced; otherwise decide gets the keys' values (nil
// when absent), in the order of keys, and returns the change's writes,
// which are made in one step with held's (see queueHeld) and its task
// change. When decide returns no writes (a replay), held is not written
// either.
func (s *redisOrchestratorStore) update(ctx context.Context, held Held, keys []string, decide func(tx redis.Cmdable, vals []any) (redisstore.Write, error)) (Written, error) {
	all := slices.Clone(keys)
	if held.Task != nil {
		all = append(all, s.task(held.Task.ID))
	}
	f := held.Fence
	if f.Generation != 0 {
		all = append(all, s.k.Key("leasegen", f.RequestID))
	}
	var queued func() Written
	err := s.spec.Update(ctx, all, func(tx redis.Cmdable, vals []any) (redisstore.Write, error) {
		queued = nil
		if f.Generation != 0 {
			cur, err := leaseGeneration(vals[len(all)-1])
			if err != nil {
				return nil, err
			}
			if f.fenced(cur) {
				return nil, fmt.Errorf("write to request %s under lease %d: %w", f.RequestID, f.Generation, ErrFenced)
			}
		}
		change, err := decide(tx, vals[:len(keys)])
		if change == nil || err != nil {
			return nil, err
		}
		var task []byte
		var taskErr error
		if held.Task != nil {
			task, taskErr = s.changeTask(held.Task, vals[len(keys)])
		}
		return func(p redis.Pipeliner) error {
			if err := change(p); err != nil {
				return err
			}
			if task != nil {
				p.Set(ctx, s.task(held.Task.ID), task, 0)
			}
			q, err := s.queueHeld(ctx, p, held)
			queued = func() Written {
				w := q()
				w.TaskErr = taskErr
				return w
			}
			return err
		}, nil
	})
	if err != nil || queued == nil {
		return Written{}, err
	}
	return queued(), nil
}

// changeTask applies c to the task read as v (nil when absent) and
// returns the task to write, or why it is left as it was.
func (s *redisOrchestratorStore) changeTask(c *TaskChange, v any) ([]byte, error) {
	t := &orchestratorv1.Task{}
	if err := c.apply(t, redisstore.Decode(v, t)); err != nil {
		return nil, err
	}
	return redisstore.Marshal(t)
}

// leaseGeneration parses a leasegen value read by MGET; absent is 0.
func leaseGeneration(v any) (int64, error) {
	str, ok := v.(string)
	if !ok {
		return 0, nil
	}
	n, err := strconv.ParseInt(str, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("redis store: lease generation %q: %w", str, err)
	}
	return n, nil
}

// queueHeld queues the writing of held on p (see queueEvents and
// queueOutbox) and returns what gives what was written once p has run.
func (s *redisOrchestratorStore) queueHeld(ctx context.Context, p redis.Pipeliner, held Held) (func() Written, error) {
	events, err := s.queueEvents(ctx, p, held.Events)
	if err != nil {
		return nil, err
	}
	outbox, err := s.queueOutbox(ctx, p, held.Traces, held.Claim)
	if err != nil {
		return nil, err
	}
	s.queueDeleteOutbox(ctx, p, OutboxKeys(held.Delivered))
	return func() Written { return Written{Events: events(), Outbox: outbox()} }, nil
}

// queueEvents queues the appending of events on p and returns what gives
// the stored events (with their sequences) once p has run. RPUSH returns
// the list's new length, which is the event's sequence.
func (s *redisOrchestratorStore) queueEvents(ctx context.Context, p redis.Pipeliner, events []*orchestratorv1.TaskEvent) (func() []*orchestratorv1.TaskEvent, error) {
	out := make([]*orchestratorv1.TaskEvent, len(events))
	cmds := make([]*redis.IntCmd, len(events))
	for i, e := range events {
		out[i] = proto.CloneOf(e)
		out[i].Sequence = 0
		v, err := redisstore.Marshal(out[i])
		if err != nil {
			return nil, err
		}
		cmds[i] = p.RPush(ctx, s.k.Key("events", e.GetTaskId()), v)
		p.Publish(ctx, s.k.Key("eventsig", e.GetTaskId()), "")
	}
	return func() []*orchestratorv1.TaskEvent {
		for i, c := range cmds {
			out[i].Sequence = c.Val()
		}
		return out
	}, nil
}

func (s *redisOrchestratorStore) ListTasks(ctx context.Context, state orchestratorv1.TaskState) ([]*orchestratorv1.Task, error) {
	ids, err := s.c.SMembers(ctx, s.k.Key("tasks")).Result()
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	all, err := redisstore.MGet(ctx, s.c, keysOf(ids, s.task), func() *orchestratorv1.Task { return &orchestratorv1.Task{} })
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	var out []*orchestratorv1.Task
	for _, t := range all {
		if state == orchestratorv1.TaskState_TASK_STATE_UNSPECIFIED || t.GetState() == state {
			out = append(out, t)
		}
	}
	return out, nil
}

func keysOf(ids []string, key func(string) string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = key(id)
	}
	return out
}

func (s *redisOrchestratorStore) PutCatalogue(ctx context.Context, c *orchestratorv1.OfferedCatalogue) error {
	v, err := redisstore.Marshal(c)
	if err != nil {
		return err
	}
	if err := s.c.Set(ctx, s.k.Key("catalogue", c.GetTaskId()), v, 0).Err(); err != nil {
		return fmt.Errorf("put catalogue %s: %w", c.GetTaskId(), err)
	}
	return nil
}

func (s *redisOrchestratorStore) GetCatalogue(ctx context.Context, taskID string) (*orchestratorv1.OfferedCatalogue, error) {
	c := &orchestratorv1.OfferedCatalogue{}
	if err := redisstore.Get(ctx, s.c, s.k.Key("catalogue", taskID), c); err != nil {
		return nil, fmt.Errorf("get catalogue %s: %w", taskID, err)
	}
	return c, nil
}

// queueOpen keeps the open-requests index in step with r, in the same
// MULTI/EXEC that writes r.
func (s *redisOrchestratorStore) queueOpen(ctx context.Context, p redis.Pipeliner, r *orchestratorv1.ToolRequest) {
	if recoverable(r) {
		p.SAdd(ctx, s.k.Key("unsettled"), r.GetId())
	} else {
		p.SRem(ctx, s.k.Key("unsettled"), r.GetId())
	}
	if openAttempt(r) != nil {
		p.SAdd(ctx, s.k.Key("open"), r.GetId())
		return
	}
	p.SRem(ctx, s.k.Key("open"), r.GetId())
}

func (s *redisOrchestratorStore) CreateRequest(ctx context.Context, r *orchestratorv1.ToolRequest) (*orchestratorv1.ToolRequest, bool, error) {
	c, err := s.CreateRequestEmit(ctx, r, Held{}, LeaseTake{})
	return c.Request, c.Created, err
}

func (s *redisOrchestratorStore) CreateRequestEmit(ctx context.Context, r *orchestratorv1.ToolRequest, held Held, lease LeaseTake) (Creation, error) {
	d, err := digest.JSON([]string{r.GetTaskId(), r.GetProviderCallId()})
	if err != nil {
		return Creation{}, fmt.Errorf("request key: %w", err)
	}
	idxKey := s.k.Key("reqkey", d)
	v, err := redisstore.Marshal(r)
	if err != nil {
		return Creation{}, err
	}
	var (
		out  Creation
		take *redis.Cmd
	)
	// The (task, provider call) index entry is watched: of two replicas
	// creating the same call at once, one EXEC succeeds; the other's fails,
	// and its retry finds the entry and returns the first request. The new
	// request's own key is watched with it, so an id taken meanwhile is
	// seen too. So are the task and its catalogue, read with them (see
	// Creation).
	keys := []string{idxKey, s.req(r.GetId()), s.task(r.GetTaskId()), s.k.Key("catalogue", r.GetTaskId())}
	// A new call's index entry and a new id's record are expected not to
	// exist: a resubmission finds out in the transaction.
	s.spec.Expect(idxKey, nil)
	s.spec.Expect(s.req(r.GetId()), nil)
	w, err := s.update(ctx, held, keys, func(tx redis.Cmdable, vals []any) (redisstore.Write, error) {
		out, take = Creation{}, nil // decide may run more than once
		if existing, ok := vals[0].(string); ok {
			got := &orchestratorv1.ToolRequest{}
			if err := redisstore.Get(ctx, tx, s.req(existing), got); err != nil {
				return nil, fmt.Errorf("get request %s: %w", existing, err)
			}
			out.Request = got
			return nil, nil
		}
		if vals[1] != nil {
			return nil, fmt.Errorf("create request %s: %w", r.GetId(), kv.ErrExists)
		}
		var err error
		if out.Task, err = redisstore.DecodeOptional(vals[2], &orchestratorv1.Task{}); err != nil {
			return nil, fmt.Errorf("get task %s: %w", r.GetTaskId(), err)
		}
		if out.Catalogue, err = redisstore.DecodeOptional(vals[3], &orchestratorv1.OfferedCatalogue{}); err != nil {
			return nil, fmt.Errorf("get catalogue %s: %w", r.GetTaskId(), err)
		}
		out.Request, out.Created = proto.CloneOf(r), true
		return func(p redis.Pipeliner) error {
			p.Set(ctx, s.req(r.GetId()), v, 0)
			p.Set(ctx, idxKey, r.GetId(), 0)
			p.RPush(ctx, s.k.Key("taskreqs", r.GetTaskId()), r.GetId())
			s.queueOpen(ctx, p, r)
			if lease.Owner != "" {
				take = s.queueAcquireLease(ctx, p, r.GetId(), lease.Owner, 0, lease.TTL)
			}
			return nil
		}, nil
	})
	if err != nil {
		return Creation{}, err
	}
	out.Written = w
	if take != nil {
		if out.LeaseGeneration, err = s.leaseTaken(r.GetId(), take); err != nil {
			return Creation{}, err
		}
	}
	return out, nil
}

func (s *redisOrchestratorStore) GetRequest(ctx context.Context, id string) (*orchestratorv1.ToolRequest, error) {
	r := &orchestratorv1.ToolRequest{}
	if err := redisstore.Get(ctx, s.c, s.req(id), r); err != nil {
		return nil, fmt.Errorf("get request %s: %w", id, err)
	}
	return r, nil
}

func (s *redisOrchestratorStore) UpdateRequest(ctx context.Context, id string, fn func(*orchestratorv1.ToolRequest) error) (*orchestratorv1.ToolRequest, error) {
	out, _, err := s.UpdateRequestEmit(ctx, id, fn, Held{})
	return out, err
}

func (s *redisOrchestratorStore) UpdateRequestEmit(ctx context.Context, id string, fn func(*orchestratorv1.ToolRequest) error, held Held) (*orchestratorv1.ToolRequest, Written, error) {
	var out *orchestratorv1.ToolRequest
	w, err := s.update(ctx, held, []string{s.req(id)}, func(_ redis.Cmdable, vals []any) (redisstore.Write, error) {
		r := &orchestratorv1.ToolRequest{}
		if err := redisstore.Decode(vals[0], r); err != nil {
			return nil, fmt.Errorf("get request %s: %w", id, err)
		}
		if err := fn(r); err != nil {
			return nil, err
		}
		v, err := redisstore.Marshal(r)
		if err != nil {
			return nil, err
		}
		out = r
		return func(p redis.Pipeliner) error {
			p.Set(ctx, s.req(id), v, 0)
			s.queueOpen(ctx, p, r)
			return nil
		}, nil
	})
	if err != nil {
		return nil, Written{}, err
	}
	return out, w, nil
}

func (s *redisOrchestratorStore) SaveAttempt(ctx context.Context, requestID string, a *orchestratorv1.Attempt) (*orchestratorv1.ToolRequest, error) {
	return s.UpdateRequest(ctx, requestID, func(r *orchestratorv1.ToolRequest) error {
		mergeAttempt(r, a)
		return nil
	})
}

func (s *redisOrchestratorStore) ListRequests(ctx context.Context, taskID string) ([]*orchestratorv1.ToolRequest, error) {
	ids, err := s.c.LRange(ctx, s.k.Key("taskreqs", taskID), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("list requests of %s: %w", taskID, err)
	}
	out, err := redisstore.MGet(ctx, s.c, keysOf(ids, s.req), newToolRequest)
	if err != nil {
		return nil, fmt.Errorf("list requests of %s: %w", taskID, err)
	}
	return out, nil
}

func newToolRequest() *orchestratorv1.ToolRequest { return &orchestratorv1.ToolRequest{} }

func (s *redisOrchestratorStore) ListOpenRequests(ctx context.Context) ([]*orchestratorv1.ToolRequest, error) {
	ids, err := s.c.SMembers(ctx, s.k.Key("open")).Result()
	if err != nil {
		return nil, fmt.Errorf("list open requests: %w", err)
	}
	out, err := redisstore.MGet(ctx, s.c, keysOf(ids, s.req), newToolRequest)
	if err != nil {
		return nil, fmt.Errorf("list open requests: %w", err)
	}
	return out, nil
}

func (s *redisOrchestratorStore) ListUnsettledRequests(ctx context.Context) ([]*orchestratorv1.ToolRequest, error) {
	// Requests left with an open attempt by a version without the
	// unsettled index are in the open set only.
	ids, err := s.c.SUnion(ctx, s.k.Key("unsettled"), s.k.Key("open")).Result()
	if err != nil {
		return nil, fmt.Errorf("list unsettled requests: %w", err)
	}
	out, err := redisstore.MGet(ctx, s.c, keysOf(ids, s.req), newToolRequest)
	if err != nil {
		return nil, fmt.Errorf("list unsettled requests: %w", err)
	}
	return out, nil
}

// acquireLeaseSource takes or renews a lease in one step on the server: the key
// expires with the lease by Redis's clock, so replicas' clocks never
// disagree about it. A new lease takes the next generation of the store's
// counter (KEYS[3]; above the request's own, which a version with one
// counter per request left); a renewal (ARGV[3], the generation held)
// succeeds only while no other lease was taken since. Either keeps the
// generation ARGV[4] ms more.
const acquireLeaseSource = `
local cur = redis.call("GET", KEYS[1])
local gen = tonumber(ARGV[3])
if gen > 0 then
  if (cur == false or cur == ARGV[1]) and tonumber(redis.call("GET", KEYS[2]) or "0") == gen then
    redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
    redis.call("PEXPIRE", KEYS[2], ARGV[4])
    return gen
  end
  return 0
end
if cur ~= false and cur ~= ARGV[1] then
  return 0
end
gen = redis.call("INCR", KEYS[3])
local last = tonumber(redis.call("GET", KEYS[2]) or "0")
if gen <= last then
  gen = last + 1
  redis.call("SET", KEYS[3], gen)
end
redis.call("SET", KEYS[2], gen, "PX", ARGV[4])
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
return gen`

var acquireLease = redis.NewScript(acquireLeaseSource)

// releaseLease deletes a lease only when its owner releases it.
var releaseLease = redis.NewScript(`
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0`)

func (s *redisOrchestratorStore) AcquireLease(ctx context.Context, requestID, owner string, gen int64, ttl time.Duration) (int64, error) {
	return s.leaseTaken(requestID, s.queueAcquireLease(ctx, s.c, requestID, owner, gen, ttl))
}

// queueAcquireLease runs acquireLease on c, or queues it when c is a
// pipeline (a request's creation takes its lease in its transaction).
func (s *redisOrchestratorStore) queueAcquireLease(ctx context.Context, c redis.Scripter, requestID, owner string, gen int64, ttl time.Duration) *redis.Cmd {
	keys := []string{s.k.Key("lease", requestID), s.k.Key("leasegen", requestID), s.k.Key("leasegen_seq")}
	args := []any{owner, max(ttl.Milliseconds(), 1), gen, generationTTL(ttl).Milliseconds()}
	if _, queued := c.(redis.Pipeliner); queued {
		// The source, not its SHA-1: a transaction cannot fall back to
		// it, and the speculative write runs it by its source.
		return acquireLease.Eval(ctx, c, keys, args...)
	}
	return acquireLease.Run(ctx, c, keys, args...)
}

// leaseTaken is the generation acquireLease's cmd answered, 0 when the
// lease was not taken.
func (s *redisOrchestratorStore) leaseTaken(requestID string, cmd *redis.Cmd) (int64, error) {
	n, err := cmd.Int64()
	if err != nil {
		return 0, fmt.Errorf("acquire lease on %s: %w", requestID, err)
	}
	if n > 0 {
		// The writes fenced by this lease check the generation it set.
		s.spec.Expect(s.k.Key("leasegen", requestID), []byte(strconv.FormatInt(n, 10)))
	}
	return n, nil
}

func (s *redisOrchestratorStore) ReleaseLease(ctx context.Context, requestID, owner string) error {
	if err := releaseLease.Run(ctx, s.c, []string{s.k.Key("lease", requestID)}, owner).Err(); err != nil {
		return fmt.Errorf("release lease on %s: %w", requestID, err)
	}
	return nil
}

func (s *redisOrchestratorStore) UseApproval(ctx context.Context, requestID, approver string, at *timestamppb.Timestamp) (*orchestratorv1.ToolRequest, error) {
	// The request is watched by UpdateRequest: of two replicas using one
	// approval at once, the second is recomputed on the used approval and
	// refused.
	return s.UpdateRequest(ctx, requestID, UseApproval(approver, at))
}

func (s *redisOrchestratorStore) AppendEvent(ctx context.Context, e *orchestratorv1.TaskEvent) (*orchestratorv1.TaskEvent, error) {
	e = proto.CloneOf(e)
	e.Sequence = 0
	v, err := redisstore.Marshal(e)
	if err != nil {
		return nil, err
	}
	// RPUSH is atomic and returns the new length: the event's index is
	// length-1, so its sequence is the length, with no separate counter
	// that could drift from the list.
	n, err := s.c.RPush(ctx, s.k.Key("events", e.GetTaskId()), v).Result()
	if err != nil {
		return nil, fmt.Errorf("append event to %s: %w", e.GetTaskId(), err)
	}
	e.Sequence = n
	s.signal(ctx, e.GetTaskId())
	return e, nil
}

// signal wakes the watchers of a task on every replica (see FollowEvents).
// A lost signal only delays a watcher until its next poll: the events are
// read from the list.
func (s *redisOrchestratorStore) signal(ctx context.Context, taskID string) {
	_ = s.c.Publish(ctx, s.k.Key("eventsig", taskID), "").Err()
}

// FollowEvents reports the task of every event any replica appends, over
// one pattern subscription to the "eventsig:*" channels (a message is
// published with every append). The subscription is confirmed before it
// returns. The channel closes when ctx ends; signals sent while the
// connection was re-established are lost (WatchTask polls to bound that).
func (s *redisOrchestratorStore) FollowEvents(ctx context.Context) (<-chan string, error) {
	prefix := s.k.Key("eventsig", "")
	ps := s.c.PSubscribe(ctx, globEscape.Replace(prefix)+"*")
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return nil, fmt.Errorf("follow task events: %w", err)
	}
	out := make(chan string, 64)
	go func() {
		defer close(out)
		defer ps.Close()
		msgs := ps.Channel()
		for {
			select {
			case <-ctx.Done():
				return
			case m, ok := <-msgs:
				if !ok {
					return
				}
				select {
				case out <- strings.TrimPrefix(m.Channel, prefix):
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// globEscape quotes what a deployment prefix may hold that a Redis glob
// pattern would read as a wildcard.
var globEscape = strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`)

func (s *redisOrchestratorStore) ListEvents(ctx context.Context, taskID string, after int64) ([]*orchestratorv1.TaskEvent, error) {
	after = max(after, 0)
	vals, err := s.c.LRange(ctx, s.k.Key("events", taskID), after, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("list events of %s: %w", taskID, err)
	}
	out := make([]*orchestratorv1.TaskEvent, 0, len(vals))
	for i, v := range vals {
		e := &orchestratorv1.TaskEvent{}
		if err := redisstore.Unmarshal([]byte(v), e); err != nil {
			return nil, err
		}
		e.Sequence = after + int64(i) + 1
		out = append(out, e)
	}
	return out, nil
}

func (s *redisOrchestratorStore) AddAccessToken(ctx context.Context, t *orchestratorv1.TaskAccessToken) error {
	key := s.k.Key("tokens", t.GetTaskId())
	err := redisstore.Update(ctx, s.c, func(tx *redis.Tx) error {
		list := &orchestratorv1.TaskAccessTokens{}
		if err := redisstore.Get(ctx, tx, key, list); err != nil && !errors.Is(err, kv.ErrNotFound) {
			return err
		}
		addAccessToken(list, t)
		v, err := redisstore.Marshal(list)
		if err != nil {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, key, v, 0)
			return nil
		})
		return err
	}, key)
	if err != nil {
		return fmt.Errorf("add access token of task %s: %w", t.GetTaskId(), err)
	}
	return nil
}

func (s *redisOrchestratorStore) ListAccessTokens(ctx context.Context, taskID string) ([]*orchestratorv1.TaskAccessToken, error) {
	list := &orchestratorv1.TaskAccessTokens{}
	if err := redisstore.Get(ctx, s.c, s.k.Key("tokens", taskID), list); err != nil && !errors.Is(err, kv.ErrNotFound) {
		return nil, fmt.Errorf("list access tokens of task %s: %w", taskID, err)
	}
	return list.GetTokens(), nil
}
