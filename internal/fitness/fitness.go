// Package fitness is the evidentiary rule, in one place: whether a source
// observation can support a claim, and if not, why (its findings). The
// evidence service applies it authoritatively when it records an
// observation (and again when a claim is linked); the orchestrator applies
// it beforehand to decide whether a result's item is a source or a
// diagnostic without a round trip to evidence. Should the two disagree (a
// rolling upgrade running two versions of the rule), evidence's refusal
// (Refusal, read back with Refused) still makes the item a diagnostic.
package fitness

import (
	"mime"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/provenance"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// Finding codes of observation validation. Stable: callers and traces use
// them.
const (
	FindingMediaTypeUnknown     = "MEDIA_TYPE_UNKNOWN"
	FindingProvenanceIncomplete = "PROVENANCE_INCOMPLETE"
	FindingTitleAndLinkOnly     = "TITLE_AND_LINK_ONLY"
	FindingAssetMismatch        = "ASSET_MISMATCH"
	// FindingIdentityReserved: a source names itself with a tool-data
	// identity, or tool data names itself with anything else.
	FindingIdentityReserved = "IDENTITY_RESERVED"
)

// ReasonUnfit is the ErrorInfo reason with which evidence refuses to
// record an observation that cannot support a claim.
const ReasonUnfit = "OBSERVATION_UNFIT"

// EvidentiaryMediaTypes are the media types whose content can support a
// claim: text a person can read and quote. Anything else (binary, link
// lists, unknown types) may be fine for a connection to return, but it is
// a diagnostic result, not evidence. Compared without parameters.
var EvidentiaryMediaTypes = []string{"text/markdown", "text/plain", "text/html"}

// DataMediaTypes are the media types tool data may also have: structured
// content is recorded as its JSON.
var DataMediaTypes = []string{"application/json"}

// titleAndLink matches text that is only a title and a link, the shape of a
// search hit rather than a source: "Title — https://…", "Title: https://…",
// "[Title](https://…)", or a bare URL.
var titleAndLink = regexp.MustCompile(`(?is)^\s*(?:(?:\[[^\]\n]{0,300}\]\(\s*[a-z][a-z0-9+.-]*://[^\s)]+\s*\))|(?:[^\n]{0,300}?\s*(?:—|–|-|:|\||\s)\s*)?<?[a-z][a-z0-9+.-]*://\S+?>?)\s*$`)

// Assess applies the evidentiary rule to one observation and returns every
// reason it cannot support a claim; none means it can. Connection success
// is not fitness: a complete remote call can still return something that
// is not a source (a link, a binary blob, an item without provenance).
func Assess(o *evidencev1.SourceObservation) []*evidencev1.ValidationFinding {
	var out []*evidencev1.ValidationFinding
	add := func(code, field, detail string) {
		out = append(out, &evidencev1.ValidationFinding{Code: code, Field: field, Detail: detail})
	}
	allowed := EvidentiaryMediaTypes
	data := o.GetKind() == evidencev1.ObservationKind_OBSERVATION_KIND_TOOL_DATA
	if data {
		allowed = append(slices.Clone(EvidentiaryMediaTypes), DataMediaTypes...)
	}
	if mt := BaseMediaType(o.GetMediaType()); !slices.Contains(allowed, mt) {
		add(FindingMediaTypeUnknown, "observation.media_type",
			"media type "+quoteBounded(o.GetMediaType())+" is not one of "+strings.Join(allowed, ", "))
	}
	// Tool data and sources never share an identity: a server cannot name
	// its content so that it joins a call's data revisions, nor can data
	// pass for a source.
	switch uri := o.GetResourceUri(); {
	case uri == "":
	case data && !provenance.IsDataURI(uri):
		add(FindingIdentityReserved, "observation.resource_uri", "tool data is named by its call's "+provenance.DataScheme+": identity")
	case !data && provenance.IsDataURI(uri):
		add(FindingIdentityReserved, "observation.resource_uri", "the "+provenance.DataScheme+": scheme names tool data, never a source")
	}
	switch o.GetKind() {
	case evidencev1.ObservationKind_OBSERVATION_KIND_UNSPECIFIED, evidencev1.ObservationKind_OBSERVATION_KIND_SOURCE, evidencev1.ObservationKind_OBSERVATION_KIND_TOOL_DATA:
	default:
		add(FindingProvenanceIncomplete, "observation.kind", "unknown observation kind")
	}
	for _, f := range [][2]string{
		{"observation.connection_id", o.GetConnectionId()},
		{"observation.snapshot_id", o.GetSnapshotId()},
		{"observation.mapping_id", o.GetMappingId()},
		{"observation.request_id", o.GetRequestId()},
		{"observation.request_digest", o.GetRequestDigest()},
		{"observation.resource_uri", o.GetResourceUri()},
		{"observation.content_digest", o.GetContentDigest()},
	} {
		if f[1] == "" {
			add(FindingProvenanceIncomplete, f[0], "required provenance is missing")
		}
	}
	if o.GetMappingRevision() <= 0 {
		add(FindingProvenanceIncomplete, "observation.mapping_revision", "required provenance is missing")
	}
	if a := o.GetAssetDigest(); a != "" && a != o.GetContentDigest() {
		add(FindingAssetMismatch, "observation.asset_digest", "the asset digest differs from the content digest")
	}
	if text := observedText(o); o.GetAssetDigest() == "" && strings.TrimSpace(text) != "" && titleAndLink.MatchString(text) {
		add(FindingTitleAndLinkOnly, "observation.passages", "the content is only a title and a link: a pointer to a source, not a source")
	}
	return out
}

// Summary names findings as "CODE (field), …": the form a diagnostic's
// detail and a refusal's message and metadata give them in.
func Summary(findings []*evidencev1.ValidationFinding) string {
	parts := make([]string, 0, len(findings))
	for _, f := range findings {
		parts = append(parts, f.GetCode()+" ("+f.GetField()+")")
	}
	return strings.Join(parts, ", ")
}

// Refusal is the FAILED_PRECONDITION error refusing an observation for
// findings (at least one), with reason and what is refused in words. Its
// ErrorInfo metadata carries the first finding's code ("finding") and the
// Summary of all of them ("findings"): codes and field names only, never
// remote text, so a caller can turn the refusal into a diagnostic.
func Refusal(reason, what string, findings []*evidencev1.ValidationFinding) error {
	summary := Summary(findings)
	return apierror.New(codes.FailedPrecondition, reason,
		what+": "+summary+"; it stays a diagnostic result, not a source record",
		map[string]string{"finding": findings[0].GetCode(), "findings": summary})
}

// Refused reports whether err is evidence refusing to record an
// observation as unfit (ReasonUnfit), and if so returns the first
// finding's code and the findings' summary (the code alone from a service
// that sends no summary).
func Refused(err error) (code, findings string, ok bool) {
	if !apierror.Is(err, codes.FailedPrecondition, ReasonUnfit) {
		return "", "", false
	}
	md := apierror.Info(err).GetMetadata()
	code = md["finding"]
	if code == "" {
		return "", "", false
	}
	findings = md["findings"]
	if findings == "" {
		findings = code
	}
	return code, findings, true
}

// observedText joins an observation's passage texts.
func observedText(o *evidencev1.SourceObservation) string {
	parts := make([]string, 0, len(o.GetPassages()))
	for _, p := range o.GetPassages() {
		parts = append(parts, p.GetText())
	}
	return strings.Join(parts, "\n\n")
}

// BaseMediaType lowercases a media type and drops its parameters: the
// form media types are compared in (the adapter's allowed types, this
// rule's lists).
func BaseMediaType(t string) string {
	if mt, _, err := mime.ParseMediaType(t); err == nil {
		return mt
	}
	return strings.ToLower(strings.TrimSpace(t))
}

// quoteBounded quotes remote text for a safe detail, bounded.
func quoteBounded(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return `"` + strings.ToValidUTF8(s, "") + `"`
}
