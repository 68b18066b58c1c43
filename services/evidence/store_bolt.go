package evidence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// Buckets. Keys that group records (a source, a task) start with a digest of
// the group's identity rather than the raw strings: remote URIs and task ids
// may hold any character, and a fixed-width prefix can never collide with a
// longer identity that happens to share its first characters.
const (
	bucketObservations     = "observations"      // observation id → SourceObservation
	bucketTaskObservations = "task_observations" // task scope/seq → observation id
	bucketRevisions        = "revisions"         // source scope/number → SourceRevision
	bucketClaimLinks       = "claim_links"       // link id → ClaimLink
	bucketTrace            = "trace"             // task scope/sequence → TraceEvent
	bucketTraceSequence    = "trace_sequence"    // task scope → last sequence
	bucketTraceDelivered   = "trace_delivered"   // task scope/delivery id → sequence
	bucketReceipts         = "receipts"          // idempotency key → Receipt
)

type boltStore struct {
	db *store.DB
}

// NewBoltStore returns the embedded-file Store backed by db.
func NewBoltStore(db *store.DB) Store { return &boltStore{db: db} }

// scope returns the key prefix for a group identified by parts.
func scope(parts ...string) string {
	return digest.Strings(parts...) + "/"
}

func (b *boltStore) RecordObservation(ctx context.Context, obs *evidencev1.SourceObservation, newRevisionID string) (*evidencev1.SourceObservation, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	src := scope(obs.GetConnectionId(), obs.GetResourceUri())
	out := proto.CloneOf(obs)
	// Concurrent calls share a commit (store.DB.Batch); every run sets
	// out's revision anew.
	err := b.db.Batch(func(tx *store.Tx) error {
		var joined *evidencev1.SourceRevision
		var count int32
		err := store.List(tx, bucketRevisions, src, newRevision, func(_ string, r *evidencev1.SourceRevision) error {
			count++
			if r.GetContentDigest() == obs.GetContentDigest() {
				joined = r
			}
			return nil
		})
		if err != nil {
			return err
		}
		if joined == nil {
			joined = &evidencev1.SourceRevision{
				Id:                 newRevisionID,
				ConnectionId:       obs.GetConnectionId(),
				ResourceUri:        obs.GetResourceUri(),
				Number:             count + 1,
				ContentDigest:      obs.GetContentDigest(),
				FirstObservationId: obs.GetId(),
				FirstSeenTime:      obs.GetRetrieveTime(),
			}
			if err := tx.Create(bucketRevisions, src+store.SeqKey(int64(joined.Number)), joined); err != nil {
				return fmt.Errorf("create revision: %w", err)
			}
		}
		out.RevisionId = joined.GetId()
		out.RevisionNumber = joined.GetNumber()
		if err := tx.Create(bucketObservations, out.GetId(), out); err != nil {
			return fmt.Errorf("create observation: %w", err)
		}
		if out.GetTaskId() == "" {
			return nil
		}
		task := scope(out.GetTaskId())
		seq, err := tx.NextSequence(bucketTaskObservations)
		if err != nil {
			return err
		}
		return tx.Put(bucketTaskObservations, task+store.SeqKey(seq), wrapperspb.String(out.GetId()))
	})
	if err != nil {
		return nil, fmt.Errorf("evidence: record observation: %w", err)
	}
	return out, nil
}

func (b *boltStore) GetObservation(ctx context.Context, id string) (*evidencev1.SourceObservation, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	obs := &evidencev1.SourceObservation{}
	if err := b.db.View(func(tx *store.Tx) error { return tx.Get(bucketObservations, id, obs) }); err != nil {
		return nil, fmt.Errorf("evidence: get observation: %w", err)
	}
	return obs, nil
}

func (b *boltStore) ListObservations(ctx context.Context, taskID string) ([]*evidencev1.SourceObservation, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	task := scope(taskID)
	var out []*evidencev1.SourceObservation
	err := b.db.View(func(tx *store.Tx) error {
		return store.List(tx, bucketTaskObservations, task, newStringValue, func(_ string, id *wrapperspb.StringValue) error {
			obs := &evidencev1.SourceObservation{}
			if err := tx.Get(bucketObservations, id.GetValue(), obs); err != nil {
				return fmt.Errorf("indexed observation %s: %w", id.GetValue(), err)
			}
			out = append(out, obs)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("evidence: list observations: %w", err)
	}
	return out, nil
}

func (b *boltStore) ListRevisions(ctx context.Context, connectionID, resourceURI string) ([]*evidencev1.SourceRevision, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	src := scope(connectionID, resourceURI)
	var out []*evidencev1.SourceRevision
	err := b.db.View(func(tx *store.Tx) error {
		return store.List(tx, bucketRevisions, src, newRevision, func(_ string, r *evidencev1.SourceRevision) error {
			out = append(out, r)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("evidence: list revisions: %w", err)
	}
	return out, nil
}

func (b *boltStore) CreateClaimLink(ctx context.Context, link *evidencev1.ClaimLink) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := b.db.Update(func(tx *store.Tx) error { return tx.Create(bucketClaimLinks, link.GetId(), link) }); err != nil {
		return fmt.Errorf("evidence: create claim link: %w", err)
	}
	return nil
}

func (b *boltStore) AppendTrace(ctx context.Context, ev *evidencev1.TraceEvent) (*evidencev1.TraceEvent, error) {
	out, err := b.AppendTraces(ctx, []*evidencev1.TraceEvent{ev})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

func (b *boltStore) AppendTraces(ctx context.Context, evs []*evidencev1.TraceEvent) ([]*evidencev1.TraceEvent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([]*evidencev1.TraceEvent, len(evs))
	tasks := make([]string, len(evs))
	for i, ev := range evs {
		tasks[i] = scope(ev.GetTaskId())
	}
	// Concurrent calls share a commit; the function sets every event of
	// out on each run, so running it again is safe.
	err := b.db.Batch(func(tx *store.Tx) error {
		for i := range out {
			id := evs[i].GetDeliveryId()
			delivered := tasks[i] + id
			if id != "" {
				seq := &wrapperspb.Int64Value{}
				err := tx.Get(bucketTraceDelivered, delivered, seq)
				if err == nil {
					// Delivered before: the first one stands.
					out[i] = newTraceEvent()
					if err := tx.Get(bucketTrace, tasks[i]+store.SeqKey(seq.GetValue()), out[i]); err != nil {
						return err
					}
					out[i].Sequence = seq.GetValue()
					continue
				}
				if !errors.Is(err, store.ErrNotFound) {
					return err
				}
			}
			ev := proto.CloneOf(evs[i]) // a rerun of the batch starts again from what was sent
			out[i] = ev
			last := &wrapperspb.Int64Value{}
			if err := tx.Get(bucketTraceSequence, tasks[i], last); err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
			ev.Sequence = last.GetValue() + 1
			if err := tx.Put(bucketTraceSequence, tasks[i], wrapperspb.Int64(ev.Sequence)); err != nil {
				return err
			}
			if err := tx.Create(bucketTrace, tasks[i]+store.SeqKey(ev.Sequence), ev); err != nil {
				return err
			}
			if id != "" {
				if err := tx.Put(bucketTraceDelivered, delivered, wrapperspb.Int64(ev.Sequence)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("evidence: append trace: %w", err)
	}
	return out, nil
}

func (b *boltStore) ListTrace(ctx context.Context, taskID string) ([]*evidencev1.TraceEvent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	task := scope(taskID)
	var out []*evidencev1.TraceEvent
	err := b.db.View(func(tx *store.Tx) error {
		return store.List(tx, bucketTrace, task, newTraceEvent, func(_ string, ev *evidencev1.TraceEvent) error {
			out = append(out, ev)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("evidence: list trace: %w", err)
	}
	return out, nil
}

func (b *boltStore) RewriteTrace(ctx context.Context, cutoff time.Time, rewrite func(*evidencev1.TraceEvent) bool) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	changed := 0
	err := b.db.Update(func(tx *store.Tx) error {
		// Collect first, write after: bbolt cursors are not stable across
		// writes to the bucket they walk.
		pending := map[string]*evidencev1.TraceEvent{}
		err := store.List(tx, bucketTrace, "", newTraceEvent, func(key string, ev *evidencev1.TraceEvent) error {
			if !ev.GetTime().AsTime().Before(cutoff) {
				return nil
			}
			id, task, seq := ev.GetId(), ev.GetTaskId(), ev.GetSequence()
			if !rewrite(ev) {
				return nil
			}
			ev.Id, ev.TaskId, ev.Sequence = id, task, seq
			pending[key] = ev
			return nil
		})
		if err != nil {
			return err
		}
		for key, ev := range pending {
			if err := tx.Put(bucketTrace, key, ev); err != nil {
				return err
			}
		}
		changed = len(pending)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("evidence: rewrite trace: %w", err)
	}
	return changed, nil
}

func (b *boltStore) CreateReceipt(ctx context.Context, r *evidencev1.Receipt) (*evidencev1.Receipt, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	var (
		stored  *evidencev1.Receipt
		created bool
	)
	err := b.db.Batch(func(tx *store.Tx) error {
		stored, created = proto.CloneOf(r), false // anew on every run (see store.DB.Batch)
		err := tx.Create(bucketReceipts, r.GetIdempotencyKey(), r)
		switch {
		case err == nil:
			created = true
			return nil
		case errors.Is(err, store.ErrExists):
			stored = &evidencev1.Receipt{}
			return tx.Get(bucketReceipts, r.GetIdempotencyKey(), stored)
		default:
			return err
		}
	})
	if err != nil {
		return nil, false, fmt.Errorf("evidence: create receipt: %w", err)
	}
	return stored, created, nil
}

func (b *boltStore) GetReceipt(ctx context.Context, idempotencyKey string) (*evidencev1.Receipt, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r := &evidencev1.Receipt{}
	if err := b.db.View(func(tx *store.Tx) error { return tx.Get(bucketReceipts, idempotencyKey, r) }); err != nil {
		return nil, fmt.Errorf("evidence: get receipt: %w", err)
	}
	return r, nil
}

func newRevision() *evidencev1.SourceRevision { return &evidencev1.SourceRevision{} }
func newTraceEvent() *evidencev1.TraceEvent   { return &evidencev1.TraceEvent{} }
func newStringValue() *wrapperspb.StringValue { return &wrapperspb.StringValue{} }

const (
	bucketAudit = "audit" // sequence → AuditRecord, append-only
	// bucketAuditRequests maps an append's request id to the sequence
	// key of the record it appended, kept as long as the record.
	bucketAuditRequests = "audit_requests"
)

// errEnough stops a listing that has what it needs.
var errEnough = errors.New("enough")

func (b *boltStore) AppendAudit(ctx context.Context, rec *evidencev1.AuditRecord, requestID string) (*evidencev1.AuditRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := proto.CloneOf(rec)
	err := b.db.Update(func(tx *store.Tx) error {
		if requestID != "" {
			prior, err := store.GetOptional(tx, bucketAuditRequests, requestID, &wrapperspb.StringValue{})
			if err != nil {
				return err
			}
			if prior != nil {
				out = newAuditRecord()
				return tx.Get(bucketAudit, prior.GetValue(), out)
			}
		}
		seq, err := tx.NextSequence(bucketAudit)
		if err != nil {
			return err
		}
		out.Sequence = seq
		if requestID != "" {
			if err := tx.Put(bucketAuditRequests, requestID, wrapperspb.String(store.SeqKey(seq))); err != nil {
				return err
			}
		}
		return tx.Create(bucketAudit, store.SeqKey(seq), out)
	})
	if err != nil {
		return nil, fmt.Errorf("evidence: append audit record: %w", err)
	}
	return out, nil
}

func (b *boltStore) ListAudit(ctx context.Context, after int64, limit int, match func(*evidencev1.AuditRecord) bool) ([]*evidencev1.AuditRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []*evidencev1.AuditRecord
	err := b.db.View(func(tx *store.Tx) error {
		return store.List(tx, bucketAudit, "", newAuditRecord, func(_ string, r *evidencev1.AuditRecord) error {
			if r.GetSequence() <= after || !match(r) {
				return nil
			}
			out = append(out, r)
			if len(out) >= limit {
				return errEnough
			}
			return nil
		})
	})
	if err != nil && !errors.Is(err, errEnough) {
		return nil, fmt.Errorf("evidence: list audit records: %w", err)
	}
	return out, nil
}

func newAuditRecord() *evidencev1.AuditRecord { return &evidencev1.AuditRecord{} }
