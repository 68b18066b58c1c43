package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	kv "github.com/v0m3/v0m3/internal/store"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// Buckets of the embedded store.
const (
	bucketTasks        = "tasks"         // task id -> Task
	bucketCatalogues   = "catalogues"    // task id -> OfferedCatalogue
	bucketRequests     = "requests"      // request id -> ToolRequest
	bucketRequestKeys  = "request_keys"  // task id NUL provider call id -> request id
	bucketTaskRequests = "task_requests" // task id "/" seq -> request id (creation order)
	bucketEventSeq     = "event_seq"     // task id -> last event sequence
	bucketEvents       = "events"        // task id "/" seq -> TaskEvent
	bucketOpen         = "open_requests" // request id -> request id, while an attempt has no end time
	bucketUnsettled    = "unsettled"     // request id -> request id, while recoverable (see recoverable)
	bucketAccessTokens = "access_tokens" // task id -> TaskAccessTokens (digests of MCP tokens)
)

type boltStore struct {
	db *kv.DB

	leaseMu sync.Mutex
	leases  map[string]boltLease // see AcquireLease
	gens    map[string]boltGen   // request id -> newest lease generation
	lastGen int64                // the newest generation of any request
	genKeep time.Duration        // see boltGenerationKeep
	pruned  time.Time            // when leases and gens last lost those that ended
}

// NewBoltStore returns the Store backed by the embedded bbolt file.
func NewBoltStore(db *kv.DB) Store {
	return &boltStore{db: db, leases: map[string]boltLease{}, gens: map[string]boltGen{}, genKeep: boltGenerationKeep}
}

// boltGenerationKeep is how long the embedded store keeps a request's
// lease generation after its lease was last taken or renewed (at least
// three lease ttls; Redis keeps them leaseGenerationTTL, a day, for
// replicas that may pause that long). A bbolt file is open in one process
// only: a writer of this process stalled longer than this is fenced (a
// forgotten generation fences every write under it) and recovery takes
// its request again. Keeping a day here held some 100 bytes in memory for
// every call of the last day.
const boltGenerationKeep = 10 * time.Minute

func requestKey(taskID, providerCallID string) string { return taskID + "\x00" + providerCallID }

func (b *boltStore) CreateTask(_ context.Context, t *orchestratorv1.Task) error {
	return b.db.Update(func(tx *kv.Tx) error {
		if err := tx.Create(bucketTasks, t.GetId(), t); err != nil {
			return fmt.Errorf("create task %s: %w", t.GetId(), err)
		}
		return nil
	})
}

func (b *boltStore) GetTask(_ context.Context, id string) (*orchestratorv1.Task, error) {
	t := &orchestratorv1.Task{}
	if err := b.db.View(func(tx *kv.Tx) error { return tx.Get(bucketTasks, id, t) }); err != nil {
		return nil, fmt.Errorf("get task %s: %w", id, err)
	}
	return t, nil
}

func (b *boltStore) UpdateTask(ctx context.Context, id string, fn func(*orchestratorv1.Task) error) (*orchestratorv1.Task, error) {
	out, _, err := b.UpdateTaskEmit(ctx, id, fn, Held{})
	return out, err
}

func (b *boltStore) UpdateTaskEmit(_ context.Context, id string, fn func(*orchestratorv1.Task) error, held Held) (*orchestratorv1.Task, Written, error) {
	var (
		out     *orchestratorv1.Task
		emitted Written
	)
	// Concurrent updates share a commit (kv.DB.Batch): fn may run again,
	// as the Store contract allows; what the closure returns is set anew on
	// every run.
	if held.Task != nil {
		return nil, Written{}, errTaskChangeHeld
	}
	err := b.db.Batch(func(tx *kv.Tx) error {
		if err := b.fence(held.Fence); err != nil {
			return err
		}
		t := &orchestratorv1.Task{}
		if err := tx.Get(bucketTasks, id, t); err != nil {
			return fmt.Errorf("get task %s: %w", id, err)
		}
		if err := fn(t); err != nil {
			return err
		}
		out = t
		if err := tx.Put(bucketTasks, id, t); err != nil {
			return err
		}
		var err error
		emitted, err = writeHeld(tx, held)
		return err
	})
	if err != nil {
		return nil, Written{}, err
	}
	return out, emitted, nil
}

func (b *boltStore) ListTasks(_ context.Context, state orchestratorv1.TaskState) ([]*orchestratorv1.Task, error) {
	var out []*orchestratorv1.Task
	err := b.db.View(func(tx *kv.Tx) error {
		return kv.List(tx, bucketTasks, "", func() *orchestratorv1.Task { return &orchestratorv1.Task{} },
			func(_ string, t *orchestratorv1.Task) error {
				if state == orchestratorv1.TaskState_TASK_STATE_UNSPECIFIED || t.GetState() == state {
					out = append(out, t)
				}
				return nil
			})
	})
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	return out, nil
}

func (b *boltStore) PutCatalogue(_ context.Context, c *orchestratorv1.OfferedCatalogue) error {
	if err := b.db.Update(func(tx *kv.Tx) error { return tx.Put(bucketCatalogues, c.GetTaskId(), c) }); err != nil {
		return fmt.Errorf("put catalogue %s: %w", c.GetTaskId(), err)
	}
	return nil
}

func (b *boltStore) GetCatalogue(_ context.Context, taskID string) (*orchestratorv1.OfferedCatalogue, error) {
	c := &orchestratorv1.OfferedCatalogue{}
	if err := b.db.View(func(tx *kv.Tx) error { return tx.Get(bucketCatalogues, taskID, c) }); err != nil {
		return nil, fmt.Errorf("get catalogue %s: %w", taskID, err)
	}
	return c, nil
}

func (b *boltStore) CreateRequest(ctx context.Context, r *orchestratorv1.ToolRequest) (*orchestratorv1.ToolRequest, bool, error) {
	c, err := b.CreateRequestEmit(ctx, r, Held{}, LeaseTake{})
	return c.Request, c.Created, err
}

func (b *boltStore) CreateRequestEmit(ctx context.Context, r *orchestratorv1.ToolRequest, held Held, lease LeaseTake) (Creation, error) {
	var out Creation
	err := b.db.Batch(func(tx *kv.Tx) error {
		out = Creation{} // set anew on every run (see kv.DB.Batch)
		if err := b.fence(held.Fence); err != nil {
			return err
		}
		key := requestKey(r.GetTaskId(), r.GetProviderCallId())
		existing := &wrapperspb.StringValue{}
		switch err := tx.Get(bucketRequestKeys, key, existing); {
		case err == nil:
			got := &orchestratorv1.ToolRequest{}
			if err := tx.Get(bucketRequests, existing.GetValue(), got); err != nil {
				return fmt.Errorf("get request %s: %w", existing.GetValue(), err)
			}
			out.Request = got
			return nil
		case !errors.Is(err, kv.ErrNotFound):
			return err
		}
		if err := tx.Create(bucketRequests, r.GetId(), r); err != nil {
			return fmt.Errorf("create request %s: %w", r.GetId(), err)
		}
		if err := indexOpen(tx, r); err != nil {
			return err
		}
		if err := tx.Put(bucketRequestKeys, key, wrapperspb.String(r.GetId())); err != nil {
			return err
		}
		n, err := tx.NextSequence(bucketTaskRequests)
		if err != nil {
			return err
		}
		if err := tx.Put(bucketTaskRequests, r.GetTaskId()+"/"+kv.SeqKey(n), wrapperspb.String(r.GetId())); err != nil {
			return err
		}
		if out.Task, err = kv.GetOptional(tx, bucketTasks, r.GetTaskId(), &orchestratorv1.Task{}); err != nil {
			return fmt.Errorf("get task %s: %w", r.GetTaskId(), err)
		}
		if out.Catalogue, err = kv.GetOptional(tx, bucketCatalogues, r.GetTaskId(), &orchestratorv1.OfferedCatalogue{}); err != nil {
			return fmt.Errorf("get catalogue %s: %w", r.GetTaskId(), err)
		}
		if out.Written, err = writeHeld(tx, held); err != nil {
			return err
		}
		out.Request, out.Created = proto.CloneOf(r), true
		return nil
	})
	if err != nil {
		return Creation{}, err
	}
	if out.Created && lease.Owner != "" {
		// Leases live in memory (see boltLease): taken once the creation
		// committed, by the one process that could ever recover it.
		if out.LeaseGeneration, err = b.AcquireLease(ctx, r.GetId(), lease.Owner, 0, lease.TTL); err != nil {
			return Creation{}, err
		}
	}
	return out, nil
}

func (b *boltStore) GetRequest(_ context.Context, id string) (*orchestratorv1.ToolRequest, error) {
	r := &orchestratorv1.ToolRequest{}
	if err := b.db.View(func(tx *kv.Tx) error { return tx.Get(bucketRequests, id, r) }); err != nil {
		return nil, fmt.Errorf("get request %s: %w", id, err)
	}
	return r, nil
}

func (b *boltStore) UpdateRequest(ctx context.Context, id string, fn func(*orchestratorv1.ToolRequest) error) (*orchestratorv1.ToolRequest, error) {
	out, _, err := b.UpdateRequestEmit(ctx, id, fn, Held{})
	return out, err
}

func (b *boltStore) UpdateRequestEmit(_ context.Context, id string, fn func(*orchestratorv1.ToolRequest) error, held Held) (*orchestratorv1.ToolRequest, Written, error) {
	var (
		out     *orchestratorv1.ToolRequest
		emitted Written
	)
	err := b.db.Batch(func(tx *kv.Tx) error {
		if err := b.fence(held.Fence); err != nil {
			return err
		}
		r := &orchestratorv1.ToolRequest{}
		if err := tx.Get(bucketRequests, id, r); err != nil {
			return fmt.Errorf("get request %s: %w", id, err)
		}
		if err := fn(r); err != nil {
			return err
		}
		out = r
		if err := indexOpen(tx, r); err != nil {
			return err
		}
		if err := tx.Put(bucketRequests, id, r); err != nil {
			return err
		}
		var err error
		emitted, err = writeHeld(tx, held)
		return err
	})
	if err != nil {
		return nil, Written{}, err
	}
	return out, emitted, nil
}

func (b *boltStore) SaveAttempt(ctx context.Context, requestID string, a *orchestratorv1.Attempt) (*orchestratorv1.ToolRequest, error) {
	return b.UpdateRequest(ctx, requestID, func(r *orchestratorv1.ToolRequest) error {
		mergeAttempt(r, a)
		return nil
	})
}

func (b *boltStore) ListRequests(_ context.Context, taskID string) ([]*orchestratorv1.ToolRequest, error) {
	var out []*orchestratorv1.ToolRequest
	err := b.db.View(func(tx *kv.Tx) error {
		return kv.List(tx, bucketTaskRequests, taskID+"/", func() *wrapperspb.StringValue { return &wrapperspb.StringValue{} },
			func(_ string, id *wrapperspb.StringValue) error {
				r := &orchestratorv1.ToolRequest{}
				if err := tx.Get(bucketRequests, id.GetValue(), r); err != nil {
					return fmt.Errorf("get request %s: %w", id.GetValue(), err)
				}
				out = append(out, r)
				return nil
			})
	})
	if err != nil {
		return nil, fmt.Errorf("list requests of %s: %w", taskID, err)
	}
	return out, nil
}

func (b *boltStore) AppendEvent(_ context.Context, e *orchestratorv1.TaskEvent) (*orchestratorv1.TaskEvent, error) {
	var out []*orchestratorv1.TaskEvent
	err := b.db.Batch(func(tx *kv.Tx) error {
		var err error
		out, err = appendEvents(tx, []*orchestratorv1.TaskEvent{e})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("append event to %s: %w", e.GetTaskId(), err)
	}
	return out[0], nil
}

func (b *boltStore) EmitHeld(_ context.Context, held Held) (Written, error) {
	var emitted Written
	err := b.db.Batch(func(tx *kv.Tx) error {
		if err := b.fence(held.Fence); err != nil {
			return err
		}
		var err error
		emitted, err = writeHeld(tx, held)
		return err
	})
	if err != nil {
		return Written{}, err
	}
	return emitted, nil
}

// writeHeld appends held's task events, puts its trace events in the
// outbox and applies its task change, inside tx.
func writeHeld(tx *kv.Tx, held Held) (Written, error) {
	events, err := appendEvents(tx, held.Events)
	if err != nil {
		return Written{}, err
	}
	outbox, err := putOutbox(tx, held.Traces)
	if err != nil {
		return Written{}, err
	}
	if err := deleteOutbox(tx, OutboxKeys(held.Delivered)); err != nil {
		return Written{}, err
	}
	w := Written{Events: events, Outbox: outbox}
	if c := held.Task; c != nil {
		t := &orchestratorv1.Task{}
		if w.TaskErr = c.apply(t, tx.Get(bucketTasks, c.ID, t)); w.TaskErr == nil {
			if err := tx.Put(bucketTasks, c.ID, t); err != nil {
				return Written{}, err
			}
		}
	}
	return w, nil
}

// appendEvents stores copies of events, each with its task's next
// sequence, and returns them.
func appendEvents(tx *kv.Tx, events []*orchestratorv1.TaskEvent) ([]*orchestratorv1.TaskEvent, error) {
	out := make([]*orchestratorv1.TaskEvent, 0, len(events))
	for _, e := range events {
		e = proto.CloneOf(e)
		last := &wrapperspb.Int64Value{}
		if err := tx.Get(bucketEventSeq, e.GetTaskId(), last); err != nil && !errors.Is(err, kv.ErrNotFound) {
			return nil, err
		}
		e.Sequence = last.GetValue() + 1
		if err := tx.Put(bucketEventSeq, e.GetTaskId(), wrapperspb.Int64(e.Sequence)); err != nil {
			return nil, err
		}
		if err := tx.Put(bucketEvents, e.GetTaskId()+"/"+kv.SeqKey(e.Sequence), e); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func (b *boltStore) ListEvents(_ context.Context, taskID string, after int64) ([]*orchestratorv1.TaskEvent, error) {
	var out []*orchestratorv1.TaskEvent
	err := b.db.View(func(tx *kv.Tx) error {
		return kv.List(tx, bucketEvents, taskID+"/", func() *orchestratorv1.TaskEvent { return &orchestratorv1.TaskEvent{} },
			func(_ string, e *orchestratorv1.TaskEvent) error {
				if e.GetSequence() > after {
					out = append(out, e)
				}
				return nil
			})
	})
	if err != nil {
		return nil, fmt.Errorf("list events of %s: %w", taskID, err)
	}
	return out, nil
}

// indexOpen keeps the open-requests index in step with r, inside the
// transaction that writes r.
func indexOpen(tx *kv.Tx, r *orchestratorv1.ToolRequest) error {
	var err error
	if recoverable(r) {
		err = tx.Put(bucketUnsettled, r.GetId(), wrapperspb.String(r.GetId()))
	} else {
		err = tx.Delete(bucketUnsettled, r.GetId())
	}
	if err != nil {
		return err
	}
	if openAttempt(r) != nil {
		return tx.Put(bucketOpen, r.GetId(), wrapperspb.String(r.GetId()))
	}
	return tx.Delete(bucketOpen, r.GetId())
}

func (b *boltStore) ListOpenRequests(_ context.Context) ([]*orchestratorv1.ToolRequest, error) {
	out, err := b.listIndexed(bucketOpen)
	if err != nil {
		return nil, fmt.Errorf("list open requests: %w", err)
	}
	return out, nil
}

func (b *boltStore) ListUnsettledRequests(_ context.Context) ([]*orchestratorv1.ToolRequest, error) {
	out, err := b.listIndexed(bucketUnsettled)
	if err != nil {
		return nil, fmt.Errorf("list unsettled requests: %w", err)
	}
	// Requests left with an open attempt by a version without the
	// unsettled index are in the open index only.
	open, err := b.listIndexed(bucketOpen)
	if err != nil {
		return nil, fmt.Errorf("list unsettled requests: %w", err)
	}
	seen := make(map[string]bool, len(out))
	for _, r := range out {
		seen[r.GetId()] = true
	}
	for _, r := range open {
		if !seen[r.GetId()] {
			out = append(out, r)
		}
	}
	return out, nil
}

// listIndexed returns the requests an index bucket names.
func (b *boltStore) listIndexed(bucket string) ([]*orchestratorv1.ToolRequest, error) {
	var out []*orchestratorv1.ToolRequest
	err := b.db.View(func(tx *kv.Tx) error {
		return kv.List(tx, bucket, "", func() *wrapperspb.StringValue { return &wrapperspb.StringValue{} },
			func(_ string, id *wrapperspb.StringValue) error {
				r := &orchestratorv1.ToolRequest{}
				if err := tx.Get(bucketRequests, id.GetValue(), r); err != nil {
					return fmt.Errorf("get request %s: %w", id.GetValue(), err)
				}
				out = append(out, r)
				return nil
			})
	})
	return out, err
}

// Leases of a bbolt file live in memory: the file is open in one process
// at a time, so a lease could only ever be this process's, and one left by
// a process that died must not outlive it (its requests are resumed at
// once on restart). Nothing is written, so a claim costs no fsync; for the
// same reason generations need not survive the process: no writer of an
// earlier one does.
type boltLease struct {
	owner  string
	expiry time.Time
}

// boltGen is a request's newest lease generation, kept until kept (see
// boltGenerationKeep).
type boltGen struct {
	gen  int64
	kept time.Time
}

// gen returns the request's newest lease generation, 0 when none is kept.
func (b *boltStore) gen(requestID string, now time.Time) int64 {
	if g, ok := b.gens[requestID]; ok && g.kept.After(now) {
		return g.gen
	}
	return 0
}

// leaseSweep is how often the leases that expired and the generations
// kept no more are forgotten: a settled request's lease is left to expire
// (see lease.settled).
const leaseSweep = time.Minute

// prune forgets, once in a while, the leases that expired and the
// generations kept no more.
func (b *boltStore) prune(now time.Time) {
	if now.Sub(b.pruned) < min(leaseSweep, b.genKeep) {
		return
	}
	b.pruned = now
	for id, l := range b.leases {
		if !l.expiry.After(now) {
			delete(b.leases, id)
		}
	}
	for id, g := range b.gens {
		if !g.kept.After(now) {
			delete(b.gens, id)
		}
	}
}

func (b *boltStore) AcquireLease(_ context.Context, requestID, owner string, gen int64, ttl time.Duration) (int64, error) {
	b.leaseMu.Lock()
	defer b.leaseMu.Unlock()
	now := time.Now()
	b.prune(now)
	cur, ok := b.leases[requestID]
	live := ok && cur.expiry.After(now)
	if gen != 0 {
		// A renewal, of this generation only.
		if b.gen(requestID, now) != gen || (live && cur.owner != owner) {
			return 0, nil
		}
	} else {
		if live && cur.owner != owner {
			return 0, nil // another owner's lease is live
		}
		b.lastGen++
		gen = b.lastGen
	}
	b.gens[requestID] = boltGen{gen: gen, kept: now.Add(max(b.genKeep, 3*ttl))}
	b.leases[requestID] = boltLease{owner: owner, expiry: now.Add(ttl)}
	return gen, nil
}

// fence fails with ErrFenced when f is stale; called inside the write's
// transaction, so a lease taken after it is ordered after the write.
func (b *boltStore) fence(f Fence) error {
	if f.Generation == 0 {
		return nil
	}
	b.leaseMu.Lock()
	defer b.leaseMu.Unlock()
	if f.fenced(b.gen(f.RequestID, time.Now())) {
		return fmt.Errorf("write to request %s under lease %d: %w", f.RequestID, f.Generation, ErrFenced)
	}
	return nil
}

func (b *boltStore) ReleaseLease(_ context.Context, requestID, owner string) error {
	b.leaseMu.Lock()
	defer b.leaseMu.Unlock()
	if cur, ok := b.leases[requestID]; ok && cur.owner == owner {
		delete(b.leases, requestID)
	}
	return nil
}

func (b *boltStore) UseApproval(ctx context.Context, requestID, approver string, at *timestamppb.Timestamp) (*orchestratorv1.ToolRequest, error) {
	return b.UpdateRequest(ctx, requestID, UseApproval(approver, at))
}

func (b *boltStore) AddAccessToken(_ context.Context, t *orchestratorv1.TaskAccessToken) error {
	err := b.db.Update(func(tx *kv.Tx) error {
		list := &orchestratorv1.TaskAccessTokens{}
		if err := tx.Get(bucketAccessTokens, t.GetTaskId(), list); err != nil && !errors.Is(err, kv.ErrNotFound) {
			return err
		}
		addAccessToken(list, t)
		return tx.Put(bucketAccessTokens, t.GetTaskId(), list)
	})
	if err != nil {
		return fmt.Errorf("add access token of task %s: %w", t.GetTaskId(), err)
	}
	return nil
}

func (b *boltStore) ListAccessTokens(_ context.Context, taskID string) ([]*orchestratorv1.TaskAccessToken, error) {
	list := &orchestratorv1.TaskAccessTokens{}
	err := b.db.View(func(tx *kv.Tx) error { return tx.Get(bucketAccessTokens, taskID, list) })
	if err != nil && !errors.Is(err, kv.ErrNotFound) {
		return nil, fmt.Errorf("list access tokens of task %s: %w", taskID, err)
	}
	return list.GetTokens(), nil
}
