package evidence

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/failpoint"
	"github.com/v0m3/v0m3/internal/fitness"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/paging"
	"github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// contentDigestPattern is the one spelling of a content digest. Lower-case
// hex only: the same content must always compare equal, or one content
// would become two revisions.
var contentDigestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// RecordObservation stores a source observation. The same connection and
// URI with a new content digest becomes a new source revision; the same
// digest joins the existing one. Passages are stored as given (the
// orchestrator supplies them); none given means none stored. Under an
// idempotency key the observation's id is derived from the key, so a
// retry (the first answer was lost) finds the stored one instead of
// storing it twice.
func (s *Server) RecordObservation(ctx context.Context, req *evidencev1.RecordObservationRequest) (*evidencev1.SourceObservation, error) {
	in := req.GetObservation()
	if vs := validateObservation(in); len(vs) > 0 {
		return nil, apierror.InvalidArgument("OBSERVATION_INVALID", "the observation is incomplete or malformed; see the field violations", vs...)
	}
	if findings := fitness.Assess(in); len(findings) > 0 {
		return nil, fitness.Refusal(fitness.ReasonUnfit, "the observation cannot support a claim", findings)
	}
	if err := s.checkSize(ctx, in); err != nil {
		return nil, err
	}
	obs := proto.CloneOf(in)
	// Output-only fields are assigned here whatever the caller sent.
	obs.Id = ids.New("obs")
	key := req.GetIdempotencyKey()
	if key != "" {
		obs.Id = observationID(key)
	}
	obs.RevisionId, obs.RevisionNumber = "", 0
	if obs.RetrieveTime == nil {
		obs.RetrieveTime = s.timestamp()
	}
	out, err := s.st.RecordObservation(ctx, obs, ids.New("rev"))
	if key != "" && errors.Is(err, store.ErrExists) {
		return s.recordedBefore(ctx, obs)
	}
	if err != nil {
		return nil, s.storeError(ctx, err, "record observation", "", "", nil)
	}
	failpoint.Hit(FailPointObservationAfter)
	s.log.DebugContext(ctx, "observation recorded",
		"observation_id", out.GetId(), "task_id", out.GetTaskId(), "connection_id", out.GetConnectionId(),
		"revision_id", out.GetRevisionId(), "revision_number", out.GetRevisionNumber())
	return out, nil
}

// observationID is the id of the observation recorded under an
// idempotency key: one key, one observation.
func observationID(key string) string {
	return "obs_" + strings.TrimPrefix(digest.String(key), "sha256:")[:32]
}

// recordedBefore returns the observation stored under obs's id (its
// idempotency key) when it is obs recorded before: the same task, request,
// source and content. Another observation under the key is refused.
func (s *Server) recordedBefore(ctx context.Context, obs *evidencev1.SourceObservation) (*evidencev1.SourceObservation, error) {
	first, err := s.st.GetObservation(ctx, obs.GetId())
	if err != nil {
		return nil, s.storeError(ctx, err, "read the observation recorded under the idempotency key", "", "", nil)
	}
	if first.GetTaskId() != obs.GetTaskId() || first.GetRequestId() != obs.GetRequestId() || first.GetConnectionId() != obs.GetConnectionId() ||
		first.GetResourceUri() != obs.GetResourceUri() || first.GetContentDigest() != obs.GetContentDigest() {
		return nil, apierror.New(codes.AlreadyExists, "IDEMPOTENCY_KEY_REUSED",
			"another observation was recorded under this idempotency key; a new observation needs a new key",
			map[string]string{"observation_id": first.GetId()})
	}
	s.log.DebugContext(ctx, "observation recorded before under its idempotency key", "observation_id", first.GetId(), "task_id", first.GetTaskId())
	return first, nil
}

func validateObservation(o *evidencev1.SourceObservation) []apierror.FieldViolation {
	if o == nil {
		return []apierror.FieldViolation{{Field: "observation", Description: "required"}}
	}
	vs := required(nil,
		[2]string{"observation.connection_id", o.GetConnectionId()},
		[2]string{"observation.resource_uri", o.GetResourceUri()},
		[2]string{"observation.content_digest", o.GetContentDigest()},
		[2]string{"observation.media_type", o.GetMediaType()},
		[2]string{"observation.request_id", o.GetRequestId()},
	)
	if d := o.GetContentDigest(); d != "" && !contentDigestPattern.MatchString(d) {
		vs = append(vs, apierror.FieldViolation{Field: "observation.content_digest", Description: `must be "sha256:" followed by 64 lower-case hex digits`})
	}
	if o.GetSizeBytes() < 0 {
		vs = append(vs, apierror.FieldViolation{Field: "observation.size_bytes", Description: "must not be negative"})
	}
	if t := o.GetRetrieveTime(); t != nil && t.CheckValid() != nil {
		vs = append(vs, apierror.FieldViolation{Field: "observation.retrieve_time", Description: "not a valid timestamp"})
	}
	// A claim names its passage by id, so ids must be present and distinct
	// within the observation or a link could not say which text it cites.
	seen := map[string]bool{}
	for i, p := range o.GetPassages() {
		field := fmt.Sprintf("observation.passages[%d].passage_id", i)
		switch id := p.GetPassageId(); {
		case id == "":
			vs = append(vs, apierror.FieldViolation{Field: field, Description: "required"})
		case seen[id]:
			vs = append(vs, apierror.FieldViolation{Field: field, Description: "duplicate passage id within the observation"})
		default:
			seen[id] = true
		}
	}
	return vs
}

// GetObservation returns one observation.
func (s *Server) GetObservation(ctx context.Context, req *evidencev1.GetObservationRequest) (*evidencev1.SourceObservation, error) {
	if req.GetId() == "" {
		if err := s.requireTask(ctx, authz.TraceRead, ""); err != nil {
			return nil, err
		}
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "an observation id is required", apierror.FieldViolation{Field: "id", Description: "required"})
	}
	// The task's requester and actor read their own task's evidence, as
	// they read its trace.
	return s.observationFor(ctx, authz.TraceRead, req.GetId(), "get observation", "no observation has this id; it may have been recorded under another")
}

// ListObservations returns a task's observations, oldest first. A task with
// none gets an empty list.
func (s *Server) ListObservations(ctx context.Context, req *evidencev1.ListObservationsRequest) (*evidencev1.ListObservationsResponse, error) {
	if err := s.requireTask(ctx, authz.TraceRead, req.GetTaskId()); err != nil {
		return nil, err
	}
	if req.GetTaskId() == "" {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "a task id is required", apierror.FieldViolation{Field: "task_id", Description: "required"})
	}
	list, err := s.st.ListObservations(ctx, req.GetTaskId())
	if err != nil {
		return nil, s.storeError(ctx, err, "list observations", "", "", nil)
	}
	// Observations are never removed: the order they were recorded in is
	// the order of pages.
	page, next, err := paging.PageAppendOnly(req, paging.Filter("task_id", req.GetTaskId()), list)
	if err != nil {
		return nil, err
	}
	return &evidencev1.ListObservationsResponse{Observations: page, NextPageToken: next}, nil
}

// ListRevisions returns the revisions of one source, oldest first. A source
// never observed gets an empty list.
func (s *Server) ListRevisions(ctx context.Context, req *evidencev1.ListRevisionsRequest) (*evidencev1.ListRevisionsResponse, error) {
	if err := s.require(ctx, authz.TraceRead, "source", req.GetConnectionId()); err != nil {
		return nil, err
	}
	if vs := required(nil, [2]string{"connection_id", req.GetConnectionId()}, [2]string{"resource_uri", req.GetResourceUri()}); len(vs) > 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "a source is named by its connection id and resource URI", vs...)
	}
	list, err := s.st.ListRevisions(ctx, req.GetConnectionId(), req.GetResourceUri())
	if err != nil {
		return nil, s.storeError(ctx, err, "list revisions", "", "", nil)
	}
	page, next, err := paging.Page(req, paging.Filter("connection_id", req.GetConnectionId(), "resource_uri", req.GetResourceUri()), list,
		func(r *evidencev1.SourceRevision) string { return paging.NumKey(int64(r.GetNumber()), r.GetId()) })
	if err != nil {
		return nil, err
	}
	return &evidencev1.ListRevisionsResponse{Revisions: page, NextPageToken: next}, nil
}

// checkSize keeps large content out of the record store: inline passage
// text is bounded, and an asset-backed observation must name an asset that
// exists with the same digest.
func (s *Server) checkSize(ctx context.Context, o *evidencev1.SourceObservation) error {
	var inline int64
	for _, p := range o.GetPassages() {
		inline += int64(len(p.GetText()))
	}
	if inline > s.maxInline {
		return apierror.New(codes.ResourceExhausted, "OBSERVATION_TOO_LARGE",
			fmt.Sprintf("the observation quotes %d bytes inline, more than the %d bytes evidence keeps in a record; store the content as an asset (the mapping must allow asset references)", inline, s.maxInline),
			map[string]string{"max_inline_bytes": fmt.Sprint(s.maxInline)})
	}
	if d := o.GetAssetDigest(); d != "" {
		if s.assets == nil {
			return apierror.New(codes.FailedPrecondition, "ASSETS_NOT_CONFIGURED", "this evidence service stores no assets; the observation cannot reference one", nil)
		}
		ok, err := s.assets.Has(ctx, d)
		if err != nil {
			return s.storeError(ctx, err, "check asset", "", "", nil)
		}
		if !ok {
			return apierror.New(codes.FailedPrecondition, "ASSET_UNKNOWN", "the observation references an asset that was not stored; put the asset first",
				map[string]string{"asset_digest": d})
		}
	}
	return nil
}
