package adapter

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/fitness"
	"github.com/v0m3/v0m3/internal/resultschema"
)

// Bounds on the metadata kept per item.
const (
	maxMetaKeys     = 32
	maxMetaValueLen = 256
)

// defaultMediaTypes apply when a mapping allows no media type explicitly.
var defaultMediaTypes = []string{"text/plain", "text/markdown"}

// contentError is a result that was read whole but breaks the mapping's
// limits or the tool's reviewed output schema. detail is the adapter's own
// account; untrusted is remote-influenced text (a validation error may
// quote the content), kept apart.
type contentError struct {
	code, detail, untrusted string
}

func (e *contentError) Error() string { return e.code + ": " + e.detail }

// result is a checked, converted remote result.
type result struct {
	items      []*adapterv1.ContentItem
	structured *structpb.Struct
	digest     string
	// diagnostics are the items left out (see Limits.drop_disallowed_items).
	diagnostics []*adapterv1.ItemDiagnostic
}

// fromToolResult converts and checks a tool result. With schema (the
// tool's reviewed output schema) the structured content must be present
// and valid against it: the spec obliges a tool that declares one, and a
// result that breaks its own contract is not believed in part.
func fromToolResult(res *mcp.CallToolResult, l *registryv1.Limits, schema *resultschema.Schema) (result, error) {
	if err := checkCount(len(res.Content), l); err != nil {
		return result{}, err
	}
	items := make([]*adapterv1.ContentItem, 0, len(res.Content))
	for i, c := range res.Content {
		it, err := contentItem(c)
		if err != nil {
			return result{}, err
		}
		it.Index = int32(i)
		items = append(items, it)
	}
	var structured *structpb.Struct
	if res.StructuredContent != nil {
		s, err := toStruct(res.StructuredContent)
		if err != nil {
			return result{}, fmt.Errorf("structured content: %w", err)
		}
		structured = s
	}
	if err := checkStructured(structured, schema); err != nil {
		return result{}, err
	}
	return finish(items, structured, l)
}

// checkStructured validates structured content against the tool's reviewed
// output schema, when there is one.
func checkStructured(structured *structpb.Struct, schema *resultschema.Schema) error {
	if schema == nil {
		return nil
	}
	if structured == nil {
		return &contentError{code: CodeMalformedResult,
			detail: "the tool declares an output schema but its result has no structured content"}
	}
	if err := schema.Validate(structured.AsMap()); err != nil {
		return &contentError{code: CodeMalformedResult,
			detail:    "the result's structured content does not match the tool's reviewed output schema",
			untrusted: truncate(err.Error(), maxDetailBytes)}
	}
	return nil
}

func fromReadResult(res *mcp.ReadResourceResult, l *registryv1.Limits) (result, error) {
	if err := checkCount(len(res.Contents), l); err != nil {
		return result{}, err
	}
	items := make([]*adapterv1.ContentItem, 0, len(res.Contents))
	for i, c := range res.Contents {
		if c == nil {
			return result{}, fmt.Errorf("nil resource contents")
		}
		it := resourceItem(c)
		// Result-level metadata (e.g. revision) applies to every content
		// that does not say otherwise.
		for k, v := range stringMeta(res.Meta) {
			if _, ok := it.Metadata[k]; !ok && len(it.Metadata) < maxMetaKeys {
				it.Metadata[k] = v
			}
		}
		it.Index = int32(i)
		items = append(items, it)
	}
	return finish(items, nil, l)
}

func checkCount(n int, l *registryv1.Limits) error {
	if n > int(l.GetMaxItems()) {
		return &contentError{code: CodeItemLimitExceeded, detail: fmt.Sprintf("response had %d items, max_items=%d", n, l.GetMaxItems())}
	}
	return nil
}

// finish checks media types and computes the response digest. An item of
// a media type the mapping does not allow fails the call, or, when the
// mapping says so, is left out with a diagnostic (its bytes were read and
// counted all the same).
func finish(items []*adapterv1.ContentItem, structured *structpb.Struct, l *registryv1.Limits) (result, error) {
	allowed := l.GetAllowedMediaTypes()
	if len(allowed) == 0 {
		allowed = defaultMediaTypes
	}
	allow := map[string]bool{}
	for _, a := range allowed {
		allow[fitness.BaseMediaType(a)] = true
	}
	// The transport limit allows an envelope around the content; the
	// content itself is held to max_response_bytes exactly.
	var size int64
	for _, it := range items {
		size += int64(len(it.Text)) + it.BlobSize
	}
	if size > l.GetMaxResponseBytes() {
		return result{}, &contentError{code: CodeResponseLimitExceeded,
			detail: fmt.Sprintf("response exceeded max_response_bytes=%d", l.GetMaxResponseBytes())}
	}
	kept := make([]*adapterv1.ContentItem, 0, len(items))
	var dropped []*adapterv1.ItemDiagnostic
	for _, it := range items {
		if allow[fitness.BaseMediaType(it.MediaType)] {
			kept = append(kept, it)
			continue
		}
		if !l.GetDropDisallowedItems() {
			return result{}, &contentError{code: CodeMediaTypeNotAllowed,
				detail: fmt.Sprintf("item %d has media type %q, allowed: %s", it.Index, truncate(it.MediaType, 128), strings.Join(allowed, ", "))}
		}
		mt := truncate(fitness.BaseMediaType(it.MediaType), 128)
		dropped = append(dropped, &adapterv1.ItemDiagnostic{
			Index: it.Index, MediaType: mt, SafeCode: CodeMediaTypeNotAllowed, ContentDigest: it.ContentDigest,
			AdapterDetail: fmt.Sprintf("item %d of media type %q left out: the mapping allows %s", it.Index, mt, strings.Join(allowed, ", ")),
		})
	}
	d, err := responseDigest(kept, dropped, structured)
	if err != nil {
		return result{}, err
	}
	return result{items: kept, structured: structured, digest: d, diagnostics: dropped}, nil
}

// responseDigest digests the canonical result: each item's identity and
// content digest, the items left out (position, media type and content
// digest, so the digest covers everything the server sent), and the
// structured content.
func responseDigest(items []*adapterv1.ContentItem, dropped []*adapterv1.ItemDiagnostic, structured *structpb.Struct) (string, error) {
	type canonItem struct {
		Index         int32             `json:"index"`
		URI           string            `json:"uri"`
		MediaType     string            `json:"media_type"`
		ContentDigest string            `json:"content_digest"`
		BlobSize      int64             `json:"blob_size"`
		Metadata      map[string]string `json:"metadata"`
	}
	type canonDropped struct {
		Index         int32  `json:"index"`
		MediaType     string `json:"media_type"`
		ContentDigest string `json:"content_digest"`
	}
	canon := struct {
		Items      []canonItem    `json:"items"`
		Dropped    []canonDropped `json:"dropped,omitempty"`
		Structured map[string]any `json:"structured_content"`
	}{Items: []canonItem{}}
	for _, it := range items {
		canon.Items = append(canon.Items, canonItem{it.Index, it.Uri, it.MediaType, it.ContentDigest, it.BlobSize, it.Metadata})
	}
	for _, d := range dropped {
		canon.Dropped = append(canon.Dropped, canonDropped{d.GetIndex(), d.GetMediaType(), d.GetContentDigest()})
	}
	if structured != nil {
		canon.Structured = structured.AsMap()
	}
	return digest.JSON(canon)
}

// contentItem converts one content block. Binary bytes are digested and
// counted, never returned.
func contentItem(c mcp.Content) (*adapterv1.ContentItem, error) {
	switch c := c.(type) {
	case *mcp.TextContent:
		return &adapterv1.ContentItem{MediaType: "text/plain", Text: c.Text, ContentDigest: digest.Bytes([]byte(c.Text)), Metadata: stringMeta(c.Meta)}, nil
	case *mcp.EmbeddedResource:
		if c.Resource == nil {
			return nil, fmt.Errorf("embedded resource without contents")
		}
		it := resourceItem(c.Resource)
		for k, v := range stringMeta(c.Meta) {
			if _, ok := it.Metadata[k]; !ok && len(it.Metadata) < maxMetaKeys {
				it.Metadata[k] = v
			}
		}
		return it, nil
	case *mcp.ImageContent:
		return &adapterv1.ContentItem{MediaType: c.MIMEType, BlobSize: int64(len(c.Data)), ContentDigest: digest.Bytes(c.Data), Metadata: stringMeta(c.Meta)}, nil
	case *mcp.AudioContent:
		return &adapterv1.ContentItem{MediaType: c.MIMEType, BlobSize: int64(len(c.Data)), ContentDigest: digest.Bytes(c.Data), Metadata: stringMeta(c.Meta)}, nil
	case *mcp.ResourceLink:
		// A link is not content: it names a resource. It is typed as a URI
		// list so a mapping must allow links explicitly.
		return &adapterv1.ContentItem{Uri: c.URI, MediaType: "text/uri-list", Text: c.URI, ContentDigest: digest.Bytes([]byte(c.URI)), Metadata: stringMeta(c.Meta)}, nil
	default:
		return nil, fmt.Errorf("unsupported content type %T", c)
	}
}

func resourceItem(r *mcp.ResourceContents) *adapterv1.ContentItem {
	it := &adapterv1.ContentItem{Uri: r.URI, MediaType: r.MIMEType, Metadata: stringMeta(r.Meta)}
	if r.Blob != nil {
		if it.MediaType == "" {
			it.MediaType = "application/octet-stream"
		}
		it.BlobSize = int64(len(r.Blob))
		it.ContentDigest = digest.Bytes(r.Blob)
		return it
	}
	if it.MediaType == "" {
		it.MediaType = "text/plain"
	}
	it.Text = r.Text
	it.ContentDigest = digest.Bytes([]byte(r.Text))
	return it
}

// stringMeta keeps the scalar values of a _meta map as bounded strings.
func stringMeta(m map[string]any) map[string]string {
	out := map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if len(out) == maxMetaKeys {
			break
		}
		var s string
		switch v := m[k].(type) {
		case string:
			s = v
		case float64:
			s = strconv.FormatFloat(v, 'f', -1, 64)
		case bool:
			s = strconv.FormatBool(v)
		case json.Number:
			s = v.String()
		default:
			continue
		}
		out[truncate(k, maxMetaValueLen)] = truncate(s, maxMetaValueLen)
	}
	return out
}
