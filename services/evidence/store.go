// Package evidence is the V0M3 evidence service: the single writer of source
// observations and their revisions, claim links, both trace layers and
// receipts. Content from servers is stored as quoted evidence, never acted on.
package evidence

import (
	"context"
	"time"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// Store is the evidence service's persistence contract. Every method that
// decides something from existing state (which revision an observation
// joins, the next trace sequence, whether a receipt already exists) does so
// atomically inside the store, so two concurrent callers can never both win.
// Missing records are reported as store.ErrNotFound (possibly wrapped).
type Store interface {
	// RecordObservation stores obs and assigns it to a revision of its
	// source (connection_id, resource_uri) in one atomic step: it joins the
	// revision that has the same content digest, or else creates the next
	// revision (numbered from 1) with id newRevisionID, first seen at
	// obs.retrieve_time. It returns the stored observation with revision_id
	// and revision_number set; obs itself is not modified.
	RecordObservation(ctx context.Context, obs *evidencev1.SourceObservation, newRevisionID string) (*evidencev1.SourceObservation, error)
	// GetObservation returns one observation.
	GetObservation(ctx context.Context, id string) (*evidencev1.SourceObservation, error)
	// ListObservations returns a task's observations in the order they were
	// recorded.
	ListObservations(ctx context.Context, taskID string) ([]*evidencev1.SourceObservation, error)
	// ListRevisions returns one source's revisions, oldest first.
	ListRevisions(ctx context.Context, connectionID, resourceURI string) ([]*evidencev1.SourceRevision, error)

	// CreateClaimLink stores a new claim link under its id.
	CreateClaimLink(ctx context.Context, link *evidencev1.ClaimLink) error

	// AppendTrace stores ev at the end of its task's trace, assigning the
	// next per-task sequence number (from 1) atomically. It returns the
	// stored event; ev itself is not modified.
	AppendTrace(ctx context.Context, ev *evidencev1.TraceEvent) (*evidencev1.TraceEvent, error)
	// AppendTraces is AppendTrace for several events (of any tasks) in one
	// atomic step, in order: every event is stored or none is. It returns
	// the stored events in evs's order; evs are not modified.
	AppendTraces(ctx context.Context, evs []*evidencev1.TraceEvent) ([]*evidencev1.TraceEvent, error)
	// ListTrace returns a task's events in sequence order.
	ListTrace(ctx context.Context, taskID string) ([]*evidencev1.TraceEvent, error)
	// RewriteTrace calls rewrite on every stored event whose time is before
	// cutoff, in one transaction, and stores the event again when rewrite
	// reports that it changed it. It returns how many events changed.
	// Identity fields (id, task, sequence) are restored after rewrite, so a
	// rewrite can never move an event.
	RewriteTrace(ctx context.Context, cutoff time.Time, rewrite func(*evidencev1.TraceEvent) bool) (int, error)

	// CreateReceipt stores r under its idempotency key unless a receipt with
	// that key exists. It returns the stored receipt (r, or the earlier one
	// unchanged) and whether r was the one stored.
	CreateReceipt(ctx context.Context, r *evidencev1.Receipt) (*evidencev1.Receipt, bool, error)
	// GetReceipt returns the receipt recorded under an idempotency key.
	GetReceipt(ctx context.Context, idempotencyKey string) (*evidencev1.Receipt, error)

	// AppendAudit stores rec at the end of the audit log, assigning the
	// next sequence number (from 1) atomically. It returns the stored
	// record; rec is not modified. Nothing ever changes or removes a
	// stored record. A non-empty requestID makes the append idempotent:
	// when an append with that id was stored, nothing is, and that
	// append's record is returned.
	AppendAudit(ctx context.Context, rec *evidencev1.AuditRecord, requestID string) (*evidencev1.AuditRecord, error)
	// ListAudit returns, oldest first, up to limit records after sequence
	// after for which match reports true.
	ListAudit(ctx context.Context, after int64, limit int, match func(*evidencev1.AuditRecord) bool) ([]*evidencev1.AuditRecord, error)
}
