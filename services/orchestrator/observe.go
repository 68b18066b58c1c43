package orchestrator

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/internal/digest"
)

// DefaultAssetThreshold is the content size above which a retrieval's
// content is stored as an evidence asset, when its mapping allows asset
// references (limits.asset_reference_allowed): the observation then names
// its passages by digest and position in the asset instead of holding the
// text. Smaller content, or content whose mapping does not allow assets,
// is quoted inline (evidence bounds inline text and refuses more).
const DefaultAssetThreshold = 64 << 10

// observe validates every content item of a retrieval and records each one
// that can support a claim as a source observation, returning its quoted
// excerpts. An item that cannot (no resource URI, a media type that is not
// evidence, incomplete provenance, or text that is only a title and a
// link) stays a diagnostic result: it is traced as DIAGNOSTIC with the
// finding's code and is neither recorded nor quoted. Structured content is
// never a source record either. An error means a result that could have
// been evidence was not recorded.
func (s *Server) observe(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt,
	p *prepared, remote *structpb.Struct, resp *adapterv1.ExecuteResponse) (*observed, error) {
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
	out := &observed{}
	diagnostic := func(what, reason, detail string) {
		out.diagnostics = append(out.diagnostics, &orchestratorv1.Diagnostic{Item: what, Code: reason, Detail: detail})
		s.trace(ctx, task.GetId(), &evidencev1.ProductEvent{
			Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_DIAGNOSTIC, Capability: req.GetCapability(),
			RequestId: req.GetId(), IntentId: req.GetIntentId(), AttemptId: att.GetId(), Reason: reason,
			Detail: "diagnostic, not a source record: " + what + ": " + detail,
		})
	}
	if len(resp.GetStructuredContent().GetFields()) > 0 {
		diagnostic("structured content", "STRUCTURED_CONTENT", "structured output is data about a result, not a source; it was not recorded or quoted")
	}
	useAssets := p.mapping.GetLimits().GetAssetReferenceAllowed()
	threshold := s.deps.AssetThreshold
	if threshold <= 0 {
		threshold = DefaultAssetThreshold
	}
	for _, it := range resp.GetItems() {
		size := int64(len(it.GetText()))
		if it.GetText() == "" && it.GetBlobSize() > 0 {
			size = it.GetBlobSize()
		}
		contentDigest := it.GetContentDigest()
		if contentDigest == "" {
			contentDigest = digest.Bytes([]byte(it.GetText()))
		}
		passages := splitPassages(it.GetText())
		candidate := &evidencev1.SourceObservation{
			ConnectionId:     p.mapping.GetConnectionId(),
			SnapshotId:       p.mapping.GetSnapshotId(),
			MappingId:        p.mapping.GetId(),
			MappingRevision:  p.mapping.GetRevision(),
			TaskId:           task.GetId(),
			RequestId:        att.GetId(),
			RequestDigest:    requestDigest,
			ResourceUri:      it.GetUri(),
			ContentDigest:    contentDigest,
			MediaType:        it.GetMediaType(),
			SizeBytes:        size,
			RetrieveTime:     retrieved,
			RevisionMetadata: it.GetMetadata(),
			Passages:         passages,
			ServerName:       resp.GetServerInfo().GetName(),
			ServerVersion:    resp.GetServerInfo().GetVersion(),
		}
		v, err := s.deps.Evidence.ValidateObservation(ctx, &evidencev1.ValidateObservationRequest{Observation: candidate})
		if err != nil {
			return nil, fmt.Errorf("validate item %d: %w", it.GetIndex(), err)
		}
		if !v.GetFit() {
			codes := make([]string, 0, len(v.GetFindings()))
			for _, f := range v.GetFindings() {
				codes = append(codes, f.GetCode()+" ("+f.GetField()+")")
			}
			diagnostic(fmt.Sprintf("content item %d (%s)", it.GetIndex(), it.GetMediaType()), v.GetFindings()[0].GetCode(), strings.Join(codes, ", "))
			continue
		}
		if useAssets && size > threshold && it.GetText() != "" {
			if err := s.storeAsset(ctx, candidate, it.GetText()); err != nil {
				return nil, fmt.Errorf("store item %d as an asset: %w", it.GetIndex(), err)
			}
		}
		obs, err := s.deps.Evidence.RecordObservation(ctx, &evidencev1.RecordObservationRequest{Observation: candidate})
		if err != nil {
			return nil, fmt.Errorf("record observation of item %d: %w", it.GetIndex(), err)
		}
		label := p.labels[it.GetUri()]
		if label == "" {
			label = lastSegment(it.GetUri())
		}
		where := "inline"
		if obs.GetAssetDigest() != "" {
			where = "asset " + obs.GetAssetDigest()
		}
		s.trace(ctx, task.GetId(), &evidencev1.ProductEvent{
			Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_OBSERVATION_RECORDED, Capability: req.GetCapability(),
			RequestId: req.GetId(), IntentId: req.GetIntentId(), AttemptId: att.GetId(), ObservationId: obs.GetId(),
			Detail: fmt.Sprintf("source %q revision %d (%s), %d passages, %s", label, obs.GetRevisionNumber(), contentDigest, len(passages), where),
		})
		// Excerpts are passed onward as quoted evidence with their passage
		// identity; the text comes from what was read (an asset-backed
		// observation keeps only digests and positions).
		for _, ps := range passages {
			out.excerpts = append(out.excerpts, &orchestratorv1.QuotedExcerpt{
				ObservationId: obs.GetId(),
				RevisionId:    obs.GetRevisionId(),
				PassageId:     ps.GetPassageId(),
				SourceLabel:   label,
				QuotedText:    ps.GetText(),
				ContentDigest: contentDigest,
				MediaType:     it.GetMediaType(),
			})
		}
	}
	return out, nil
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
