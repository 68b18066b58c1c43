package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/fitness"
	"github.com/v0m3/v0m3/internal/provenance"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator/tasks"
)

// DefaultAssetThreshold is the content size above which a retrieval's
// content is stored as an evidence asset, when its mapping allows asset
// references (limits.asset_reference_allowed): the observation then names
// its passages by digest and position in the asset instead of holding the
// text. Smaller content, or content whose mapping does not allow assets,
// is quoted inline (evidence bounds inline text and refuses more).
const DefaultAssetThreshold = 64 << 10

// Diagnostic codes the orchestrator itself gives items that are not
// recorded (the evidentiary rule's findings, fitness.Finding*, name
// the others).
const (
	// codeStructuredContent: structured content beside a source result is
	// data about it, not a source.
	codeStructuredContent = "STRUCTURED_CONTENT"
	// codeProvenanceMismatch: an item names another source than the one
	// the mapping attributes the result to.
	codeProvenanceMismatch = "PROVENANCE_MISMATCH"
	// codeProvenanceUnresolved: the source the mapping attributes the
	// result to could not be determined (no handle in the request, no
	// usable URI in the structured content).
	codeProvenanceUnresolved = "PROVENANCE_UNRESOLVED"
)

// maxSourceURIBytes bounds a URI taken from structured content.
const maxSourceURIBytes = 2048

// observe turns a retrieval's result into source observations by the
// mapping's declared provenance (Mapping.provenance), and returns their
// quoted excerpts:
//
//   - CONTENT_URI: each item is an observation of the URI it names itself;
//   - HANDLE_TARGET: the text of the result is one observation of the
//     target of the request's handle, the source policy authorized the
//     call for (not a value the server chose);
//   - STRUCTURED_URI: the text is one observation of the URI the
//     structured content names at the declared pointer (the adapter
//     validated the content against the reviewed output schema).
//
// The same source with a new content digest is a new revision in
// evidence, as for resources. An item that cannot support a claim (no
// URI, a media type that is not evidence, incomplete provenance, text
// that is only a title and a link, another source than the one
// attributed) stays a diagnostic result: traced as DIAGNOSTIC with the
// finding's code, neither recorded nor quoted; so do items the adapter
// left out. An error means a result that could have been evidence was
// not recorded.
func (s *Server) observe(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt,
	p *prepared, remote *structpb.Struct, resp *adapterv1.ExecuteResponse) (*observed, error) {
	r, err := s.newRecorder(ctx, task, req, att, p, remote, resp)
	if err != nil {
		return nil, err
	}
	prov := p.mapping.GetProvenance()
	structuredUsed := false
	switch provenance.Mode(prov) {
	case registryv1.ProvenanceMode_PROVENANCE_MODE_HANDLE_TARGET:
		target, ok := p.targets[prov.GetHandleField()]
		if !ok {
			r.unattributed(fmt.Sprintf("the request carries no handle in %s, whose target the mapping attributes the result to", prov.GetHandleField()))
			break
		}
		if err := r.attribute(target, p.labels[target], "the source the handle in "+prov.GetHandleField()+" names"); err != nil {
			return nil, err
		}
	case registryv1.ProvenanceMode_PROVENANCE_MODE_STRUCTURED_URI:
		structuredUsed = true
		uri, err := provenance.StringAt(resp.GetStructuredContent().AsMap(), prov.GetUriPointer())
		if err == nil {
			err = checkSourceURI(uri)
		}
		if err != nil {
			r.unattributed(fmt.Sprintf("the structured content names no usable source at %s: %v", prov.GetUriPointer(), err))
			break
		}
		label := p.labels[uri]
		if label == "" {
			label = tasks.LastSegment(uri)
		}
		if err := r.attribute(uri, label, "the source the structured content names at "+prov.GetUriPointer()); err != nil {
			return nil, err
		}
	default:
		for _, it := range resp.GetItems() {
			label := p.labels[it.GetUri()]
			if label == "" {
				label = tasks.LastSegment(it.GetUri())
			}
			c := r.candidate(it.GetUri(), it.GetText(), it.GetContentDigest(), it.GetMediaType(), itemSize(it), it.GetMetadata())
			if err := r.record(c, it.GetText(), label, itemName(it), false); err != nil {
				return nil, fmt.Errorf("item %d: %w", it.GetIndex(), err)
			}
		}
	}
	if len(resp.GetStructuredContent().GetFields()) > 0 && !structuredUsed {
		r.diagnostic("structured content", codeStructuredContent, "structured output is data about a result, not a source; it was not recorded or quoted")
	}
	return r.out, nil
}

// observeData records what a data capability's call returned
// (RESULT_KIND_DATA) as an observation of the call itself: the structured
// content, as JSON, under the call's own identity (provenance.DataURI:
// the connection, the tool and the digest of the arguments, never a URI
// the server chose), and the result's other text beside it. Asking the
// same again and getting another answer is a new revision of the same
// data. Everything is quoted back as data (QuotedExcerpt.tool_data),
// never as instructions.
func (s *Server) observeData(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt,
	p *prepared, remote *structpb.Struct, resp *adapterv1.ExecuteResponse) (*observed, error) {
	r, err := s.newRecorder(ctx, task, req, att, p, remote, resp)
	if err != nil {
		return nil, err
	}
	// The idempotency key differs for every intent; the call it keys is
	// the same call.
	args := remote.AsMap()
	if k := p.mapping.GetIdempotencyKeyField(); k != "" {
		delete(args, k)
	}
	identity, err := provenance.DataURI(p.mapping.GetConnectionId(), p.target.GetName(), args)
	if err != nil {
		return nil, err
	}
	label := req.GetCapability() + " result"
	structured := resp.GetStructuredContent()
	if structured != nil {
		text, err := json.MarshalIndent(structured.AsMap(), "", "  ")
		if err != nil {
			return nil, fmt.Errorf("encode structured content: %w", err)
		}
		c := r.candidate(identity, string(text), "", "application/json", int64(len(text)), nil)
		c.Kind = evidencev1.ObservationKind_OBSERVATION_KIND_TOOL_DATA
		if err := r.record(c, string(text), label, "structured content", true); err != nil {
			return nil, fmt.Errorf("structured content: %w", err)
		}
	}
	// Text beside structured content that only serializes it (what the
	// spec asks tools to send for older clients) is the same data.
	var rest []*adapterv1.ContentItem
	for _, it := range resp.GetItems() {
		if structured != nil && it.GetBlobSize() == 0 && sameJSON(it.GetText(), structured) {
			continue
		}
		rest = append(rest, it)
	}
	if len(rest) == 0 {
		return r.out, nil
	}
	if structured != nil {
		identity += "#text"
	}
	return r.out, r.join(rest, identity, label, "the call's data", evidencev1.ObservationKind_OBSERVATION_KIND_TOOL_DATA)
}

// sameJSON reports whether text is a JSON serialization of structured.
func sameJSON(text string, structured *structpb.Struct) bool {
	var v map[string]any
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		return false
	}
	return reflect.DeepEqual(v, structured.AsMap())
}

// checkSourceURI refuses a URI taken from structured content that cannot
// name a source: empty, oversized, not text, or holding spaces or
// controls. (A data identity is refused by evidence, for every source.)
func checkSourceURI(uri string) error {
	switch {
	case uri == "":
		return fmt.Errorf("the URI is empty")
	case len(uri) > maxSourceURIBytes:
		return fmt.Errorf("the URI is longer than %d bytes", maxSourceURIBytes)
	case !utf8.ValidString(uri) || strings.ContainsFunc(uri, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return fmt.Errorf("the URI holds spaces, control characters or invalid text")
	}
	return nil
}

// recorder turns the parts of one result into observations, excerpts and
// diagnostics, with what every observation of the call shares.
type recorder struct {
	s             *Server
	ctx           context.Context
	task          *orchestratorv1.Task
	req           *orchestratorv1.ToolRequest
	att           *orchestratorv1.Attempt
	p             *prepared
	resp          *adapterv1.ExecuteResponse
	requestDigest string
	retrieved     *timestamppb.Timestamp
	out           *observed
}

func (s *Server) newRecorder(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt,
	p *prepared, remote *structpb.Struct, resp *adapterv1.ExecuteResponse) (*recorder, error) {
	// The remote arguments carry handle targets, which are server-side
	// values; the digest never leaves the evidence service.
	requestDigest, err := digest.Struct(remote)
	if err != nil {
		return nil, fmt.Errorf("digest remote arguments: %w", err)
	}
	retrieved := resp.GetObserveTime()
	if retrieved == nil {
		retrieved = s.timestamp()
	}
	r := &recorder{s: s, ctx: ctx, task: task, req: req, att: att, p: p, resp: resp, requestDigest: requestDigest, retrieved: retrieved, out: &observed{}}
	// What the adapter left out is said first, in the result's order.
	for _, d := range resp.GetDiagnostics() {
		r.diagnostic(fmt.Sprintf("content item %d (%s)", d.GetIndex(), d.GetMediaType()), d.GetSafeCode(), "left out by the adapter: "+d.GetAdapterDetail())
	}
	return r, nil
}

// diagnostic records why something in the result is not evidence.
func (r *recorder) diagnostic(what, reason, detail string) {
	r.out.diagnostics = append(r.out.diagnostics, &orchestratorv1.Diagnostic{Item: what, Code: reason, Detail: detail})
	r.s.trace(r.ctx, r.task.GetId(), &evidencev1.ProductEvent{
		Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_DIAGNOSTIC, Capability: r.req.GetCapability(),
		RequestId: r.req.GetId(), IntentId: r.req.GetIntentId(), AttemptId: r.att.GetId(), Reason: reason,
		Detail: "diagnostic, not a source record: " + what + ": " + detail,
	})
}

// unattributed makes every item a diagnostic: the source the mapping
// attributes the result to is not known.
func (r *recorder) unattributed(why string) {
	for _, it := range r.resp.GetItems() {
		r.diagnostic(itemName(it), codeProvenanceUnresolved, why)
	}
}

// attribute records the result's items as one observation of target (the
// source the mapping's provenance names; how, in words). An item that
// names another URI of its own is not that source's content.
func (r *recorder) attribute(target, label, how string) error {
	var mine []*adapterv1.ContentItem
	for _, it := range r.resp.GetItems() {
		if it.GetUri() != "" && it.GetUri() != target {
			r.diagnostic(itemName(it), codeProvenanceMismatch, "the item names another source than "+how)
			continue
		}
		mine = append(mine, it)
	}
	if label == "" {
		label = tasks.LastSegment(target)
	}
	return r.join(mine, target, label, how, evidencev1.ObservationKind_OBSERVATION_KIND_SOURCE)
}

// join records the text of items as one observation of uri: one call
// reads one version of one source, so its items are that version's
// passages, not versions of their own. A binary item is judged on its own
// (the evidentiary rule says why it is not a source).
func (r *recorder) join(items []*adapterv1.ContentItem, uri, label, how string, kind evidencev1.ObservationKind) error {
	var (
		texts     []string
		mediaType string
		meta      = map[string]string{}
	)
	for _, it := range items {
		if it.GetText() == "" && it.GetBlobSize() > 0 {
			c := r.candidate(uri, "", it.GetContentDigest(), it.GetMediaType(), it.GetBlobSize(), it.GetMetadata())
			c.Kind = kind
			if err := r.record(c, "", label, itemName(it), kind == evidencev1.ObservationKind_OBSERVATION_KIND_TOOL_DATA); err != nil {
				return fmt.Errorf("item %d: %w", it.GetIndex(), err)
			}
			continue
		}
		texts = append(texts, it.GetText())
		switch {
		case mediaType == "":
			mediaType = it.GetMediaType()
		case mediaType != it.GetMediaType():
			// Joined text of several kinds is plain text.
			mediaType = "text/plain"
		}
		for k, v := range it.GetMetadata() {
			if _, ok := meta[k]; !ok {
				meta[k] = v
			}
		}
	}
	if len(texts) == 0 {
		return nil
	}
	text := strings.Join(texts, "\n\n")
	c := r.candidate(uri, text, "", mediaType, int64(len(text)), maps.Clone(meta))
	c.Kind = kind
	what := fmt.Sprintf("%d text items as %s", len(texts), how)
	if len(texts) == 1 {
		what = "the text as " + how
	}
	return r.record(c, text, label, what, kind == evidencev1.ObservationKind_OBSERVATION_KIND_TOOL_DATA)
}

// candidate builds the observation of content under uri.
func (r *recorder) candidate(uri, text, contentDigest, mediaType string, size int64, meta map[string]string) *evidencev1.SourceObservation {
	if contentDigest == "" {
		contentDigest = digest.Bytes([]byte(text))
	}
	m := r.p.mapping
	return &evidencev1.SourceObservation{
		ConnectionId:     m.GetConnectionId(),
		SnapshotId:       m.GetSnapshotId(),
		MappingId:        m.GetId(),
		MappingRevision:  m.GetRevision(),
		TaskId:           r.task.GetId(),
		RequestId:        r.att.GetId(),
		RequestDigest:    r.requestDigest,
		ResourceUri:      uri,
		ContentDigest:    contentDigest,
		MediaType:        mediaType,
		SizeBytes:        size,
		RetrieveTime:     r.retrieved,
		RevisionMetadata: meta,
		Passages:         splitPassages(text),
		ServerName:       r.resp.GetServerInfo().GetName(),
		ServerVersion:    r.resp.GetServerInfo().GetVersion(),
	}
}

// record assesses candidate, records it when it can support a claim (as
// an asset when large and the mapping allows) and quotes its passages;
// otherwise it is a diagnostic naming what. The rule is applied here
// (fitness.Assess), not asked of evidence, to save a round trip per item;
// evidence applies it again on record and is the authority: its refusal
// (another version of the rule, during an upgrade) makes the same
// diagnostic, not an error.
func (r *recorder) record(candidate *evidencev1.SourceObservation, text, label, what string, data bool) error {
	s, ctx := r.s, r.ctx
	if findings := fitness.Assess(candidate); len(findings) > 0 {
		r.diagnostic(what, findings[0].GetCode(), fitness.Summary(findings))
		return nil
	}
	passages := candidate.GetPassages()
	threshold := s.deps.AssetThreshold
	if threshold <= 0 {
		threshold = DefaultAssetThreshold
	}
	if r.p.mapping.GetLimits().GetAssetReferenceAllowed() && candidate.GetSizeBytes() > threshold && text != "" {
		if err := s.storeAsset(ctx, candidate, text); err != nil {
			return fmt.Errorf("store as an asset: %w", err)
		}
	}
	obs, err := s.deps.Evidence.RecordObservation(ctx, &evidencev1.RecordObservationRequest{Observation: candidate, IdempotencyKey: observationKey(candidate)})
	if code, findings, unfit := fitness.Refused(err); unfit {
		r.diagnostic(what, code, findings)
		return nil
	}
	if err != nil {
		return fmt.Errorf("record observation: %w", err)
	}
	where := "inline"
	if obs.GetAssetDigest() != "" {
		where = "asset " + obs.GetAssetDigest()
	}
	kind := "source"
	if data {
		kind = "data"
	}
	s.trace(ctx, r.task.GetId(), &evidencev1.ProductEvent{
		Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_OBSERVATION_RECORDED, Capability: r.req.GetCapability(),
		RequestId: r.req.GetId(), IntentId: r.req.GetIntentId(), AttemptId: r.att.GetId(), ObservationId: obs.GetId(),
		Detail: fmt.Sprintf("%s %q revision %d (%s), %d passages, %s", kind, label, obs.GetRevisionNumber(), candidate.GetContentDigest(), len(passages), where),
	})
	// Excerpts are passed onward as quoted evidence with their passage
	// identity; the text comes from what was read (an asset-backed
	// observation keeps only digests and positions).
	for _, ps := range passages {
		r.out.excerpts = append(r.out.excerpts, &orchestratorv1.QuotedExcerpt{
			ObservationId: obs.GetId(),
			RevisionId:    obs.GetRevisionId(),
			PassageId:     ps.GetPassageId(),
			SourceLabel:   label,
			QuotedText:    ps.GetText(),
			ContentDigest: candidate.GetContentDigest(),
			MediaType:     candidate.GetMediaType(),
			ToolData:      data,
		})
	}
	return nil
}

// observationKey is the idempotency key of an observation: one attempt
// (the observation's request id) reads one content of one source once, so
// recording it again (evidence's first answer was lost) finds the first.
func observationKey(o *evidencev1.SourceObservation) string {
	return o.GetRequestId() + "/" + digest.String(o.GetResourceUri()+"\n"+o.GetContentDigest())
}

// itemSize is an item's content size: its text, or its binary bytes.
func itemSize(it *adapterv1.ContentItem) int64 {
	if it.GetText() == "" && it.GetBlobSize() > 0 {
		return it.GetBlobSize()
	}
	return int64(len(it.GetText()))
}

// itemName names an item for a diagnostic.
func itemName(it *adapterv1.ContentItem) string {
	return fmt.Sprintf("content item %d (%s)", it.GetIndex(), it.GetMediaType())
}

// observed is what a retrieval's result became: quoted excerpts of the
// items that are evidence, and diagnostics for those that are not.
type observed struct {
	excerpts    []*orchestratorv1.QuotedExcerpt
	diagnostics []*orchestratorv1.Diagnostic
}

// storeAsset puts text into evidence as an asset and turns candidate into
// an asset-backed observation: its passages keep their identity, digest and
// position in the asset, not their text.
func (s *Server) storeAsset(ctx context.Context, candidate *evidencev1.SourceObservation, text string) error {
	a, err := s.deps.Evidence.PutAsset(ctx, &evidencev1.PutAssetRequest{
		Content: []byte(text), MediaType: candidate.GetMediaType(), ExpectedDigest: candidate.GetContentDigest(),
	})
	if err != nil {
		return err
	}
	candidate.AssetDigest = a.GetDigest()
	normalized := strings.ReplaceAll(text, "\r\n", "\n")
	offset := 0
	ref := make([]*evidencev1.Passage, 0, len(candidate.GetPassages()))
	for _, ps := range candidate.GetPassages() {
		out := &evidencev1.Passage{PassageId: ps.GetPassageId(), Index: ps.GetIndex(), TextDigest: digest.String(ps.GetText()), AssetOffset: -1}
		// Positions are exact when the asset has no CRLF line ends (the
		// passage text is then a substring of it); otherwise the digest is
		// the identity and the position is unknown (-1).
		if normalized == text {
			if i := strings.Index(text[offset:], ps.GetText()); i >= 0 {
				out.AssetOffset = int64(offset + i)
				out.AssetLength = int64(len(ps.GetText()))
				offset += i + len(ps.GetText())
			}
		}
		ref = append(ref, out)
	}
	candidate.Passages = ref
	return nil
}

// GetExcerpts returns the excerpts; nil-safe like generated getters.
func (o *observed) GetExcerpts() []*orchestratorv1.QuotedExcerpt {
	if o == nil {
		return nil
	}
	return o.excerpts
}

// awaitsObservation reports whether att is a successful read waiting for
// its observation to be recorded.
func awaitsObservation(att *orchestratorv1.Attempt) bool {
	return att.GetEndTime() == nil && att.GetOutcome() == adapterv1.Outcome_OUTCOME_OK &&
		att.GetError().GetSafeCode() == codeObservationNotRecorded
}

// recordResult turns a successful observed attempt's result into
// observations and commits the request (see observe). When evidence cannot
// record it now, the request waits with its attempt open (see
// awaitObservation) and the caller gets UNAVAILABLE; any other refusal
// fails the request, saying the result did not become evidence.
func (s *Server) recordResult(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt,
	r *unrecordedResult) (*orchestratorv1.ToolRequest, error) {
	// The response's charge is keyed by the attempt, so a wait repeats
	// it safely. Policy unavailable is no more a verdict than evidence
	// unavailable: the read waits for both.
	if err := s.chargeResponse(ctx, task, att, r.resp); err != nil {
		if transient(err) {
			s.log.WarnContext(ctx, "charge response bytes", "request", req.GetId(), "attempt", att.GetId(), "err", err)
			return s.awaitObservation(ctx, task, req, att, r, err)
		}
		defer s.unrecorded.drop(req.GetId())
		return s.withholdOverBudget(ctx, req, att, err)
	}
	observe := s.observe
	if provenance.ResultKind(r.p.capability) == registryv1.ResultKind_RESULT_KIND_DATA {
		observe = s.observeData
	}
	// What recording traces is kept only if it all succeeds: a retry
	// traces it again.
	octx, keep := provisional(ctx)
	obs, err := observe(octx, task, req, att, r.p, r.remote, r.resp)
	if err != nil {
		s.log.WarnContext(ctx, "record observation", "request", req.GetId(), "attempt", att.GetId(), "err", err)
		if transient(err) {
			return s.awaitObservation(ctx, task, req, att, r, err)
		}
		// The remote call completed but its result will not become
		// evidence: not committed, and said so.
		att.Error = &adapterv1.ErrorEvidence{SafeCode: codeObservationNotRecorded}
		defer s.unrecorded.drop(req.GetId())
		return s.fail(ctx, req, att)
	}
	keep()
	if awaitsObservation(att) {
		att.Error = nil
		att.Resolution = joinResolution(att.GetResolution(), "observation recorded once evidence was back")
	}
	if err := s.failAt(ctx, FailPointAttemptObserved); err != nil {
		return nil, err
	}
	out, err := s.commit(ctx, task, req, att, obs, nil)
	if err == nil {
		s.unrecorded.drop(req.GetId())
	}
	return out, err
}

// awaitObservation leaves a read whose observation evidence could not
// record waiting, its attempt open, with the result held for recovery
// when it fits, and tells the caller: UNAVAILABLE, the request id, and
// that the request completes once evidence is back.
func (s *Server) awaitObservation(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt,
	r *unrecordedResult, cause error) (*orchestratorv1.ToolRequest, error) {
	if !awaitsObservation(att) {
		att.Error = &adapterv1.ErrorEvidence{SafeCode: codeObservationNotRecorded}
		att.Resolution = joinResolution(att.GetResolution(),
			"the read happened; its response could not be charged or its observation recorded (a dependency is unavailable); waiting to record it once it is back")
		detail := fmt.Sprintf("attempt %d read %s; waiting for evidence to record its observation", att.GetNumber(), req.GetCapability())
		if _, err := s.updateRequest(ctx, req.GetId(), func(q *orchestratorv1.ToolRequest) error {
			mergeAttempt(q, att)
			q.UpdateTime = s.timestamp()
			return nil
		}, func(ctx context.Context) {
			s.emit(ctx, task.GetId(), req.GetId(), "request.awaiting_evidence", detail)
		}); err != nil {
			// The attempt stays open at its last persisted stage:
			// recovery finds it either way.
			s.log.ErrorContext(ctx, "persist the read awaiting its observation", "request", req.GetId(), "attempt", att.GetId(), "err", err)
		}
	}
	if r.lease == nil {
		// Held from now on, with the request's lease: the calls that
		// hold the lease leave it held.
		r.requestID, r.attemptID, r.lease = req.GetId(), att.GetId(), leaseOf(ctx)
		if r.lease != nil && s.unrecorded.hold(r) {
			r.lease.Keep()
		} else {
			s.log.WarnContext(ctx, "result not held until evidence is back; recovery reads again", "request", req.GetId(), "attempt", att.GetId())
		}
	}
	return nil, apierror.Unavailable(codeObservationNotRecorded,
		fmt.Sprintf("request %s: the read happened but its result could not be recorded yet (%s); the request waits and completes once the dependency is back (follow it with GetRequest or WatchTask)",
			req.GetId(), codeName(status.Code(cause))),
		map[string]string{"request_id": req.GetId(), "attempt_id": att.GetId()})
}
