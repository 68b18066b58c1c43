package evidence

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/redact"
	"github.com/v0m3/v0m3/internal/telemetry"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// Audit page sizes (AIP-158).
const (
	defaultAuditPage = 100
	maxAuditPage     = 1000
	// maxAuditField bounds each text field of a record.
	maxAuditField = 2048
	// maxAuditRequestID bounds an append's request id.
	maxAuditRequestID = 64
)

// AppendAuditRecord appends the record of one privileged action. The
// caller is a peer service (the access table admits no one else); it is
// recorded as recorded_by from its certificate, never from the request.
// Any word that looks like a credential is stored as "[redacted]".
func (s *Server) AppendAuditRecord(ctx context.Context, req *evidencev1.AppendAuditRecordRequest) (*evidencev1.AuditRecord, error) {
	in := req.GetRecord()
	vs := required(nil, [2]string{"record.principal", in.GetPrincipal()}, [2]string{"record.action", in.GetAction()},
		[2]string{"record.resource", in.GetResource()}, [2]string{"record.outcome", in.GetOutcome()})
	for _, f := range [][2]string{{"record.principal", in.GetPrincipal()}, {"record.action", in.GetAction()}, {"record.resource", in.GetResource()},
		{"record.revision", in.GetRevision()}, {"record.outcome", in.GetOutcome()}, {"record.detail", in.GetDetail()}} {
		if len(f[1]) > maxAuditField {
			vs = append(vs, apierror.FieldViolation{Field: f[0], Description: fmt.Sprintf("at most %d bytes", maxAuditField)})
		}
	}
	if len(req.GetRequestId()) > maxAuditRequestID {
		vs = append(vs, apierror.FieldViolation{Field: "request_id", Description: fmt.Sprintf("at most %d bytes", maxAuditRequestID)})
	}
	if len(vs) > 0 {
		return nil, apierror.InvalidArgument("AUDIT_RECORD_INVALID", "the audit record is incomplete or too large; see the field violations; nothing was stored", vs...)
	}
	rec := proto.CloneOf(in)
	rec.Id, rec.Sequence, rec.Time = ids.New("aud"), 0, s.timestamp()
	if c, ok := identity.CallerFrom(ctx); ok && c.Kind == identity.KindService {
		rec.RecordedBy = c.ID
	}
	for _, f := range []*string{&rec.Principal, &rec.Resource, &rec.Revision, &rec.Detail} {
		*f = redactWords(*f)
	}
	out, err := s.st.AppendAudit(ctx, rec, req.GetRequestId())
	if err != nil {
		return nil, s.storeError(ctx, err, "append audit record", "", "", nil)
	}
	if out.GetId() != rec.GetId() {
		return out, nil // appended before under this request id
	}
	telemetry.AuditRecords.WithLabelValues(auditLabel(out.GetAction()), auditLabel(out.GetOutcome())).Inc()
	s.log.InfoContext(ctx, "audit", "action", out.GetAction(), "principal", out.GetPrincipal(), "resource", out.GetResource(),
		"revision", out.GetRevision(), "outcome", out.GetOutcome(), "recorded_by", out.GetRecordedBy(), "sequence", out.GetSequence())
	return out, nil
}

// auditLabel bounds a metric label: actions and outcomes are constants
// in code, but the label never grows past a short name whatever a caller
// sent.
func auditLabel(v string) string {
	if len(v) > 64 || strings.ContainsAny(v, " \t\n") {
		return "other"
	}
	return v
}

// redactWords replaces each whitespace-separated word that looks like a
// credential.
func redactWords(v string) string {
	if !strings.ContainsFunc(v, func(r rune) bool { return r > ' ' }) {
		return v
	}
	words := strings.Fields(v)
	changed := false
	for i, w := range words {
		if redact.SecretValue(w) {
			words[i], changed = Redacted, true
		}
	}
	if redact.SecretValue(v) {
		return Redacted
	}
	if !changed {
		return v
	}
	return strings.Join(words, " ")
}

// ListAuditRecords lists audit records oldest first, a page at a time.
func (s *Server) ListAuditRecords(ctx context.Context, req *evidencev1.ListAuditRecordsRequest) (*evidencev1.ListAuditRecordsResponse, error) {
	if _, err := s.authz.Require(ctx, authz.AuditRead, authz.Resource{Type: "audit"}, nil); err != nil {
		return nil, err
	}
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "page_size must not be negative",
			apierror.FieldViolation{Field: "page_size", Description: "not negative"})
	case size == 0:
		size = defaultAuditPage
	case size > maxAuditPage:
		size = maxAuditPage
	}
	filter := auditFilter(req)
	after, err := parseAuditToken(req.GetPageToken(), filter)
	if err != nil {
		return nil, err
	}
	match := func(r *evidencev1.AuditRecord) bool {
		return (req.GetAction() == "" || r.GetAction() == req.GetAction()) &&
			(req.GetPrincipal() == "" || r.GetPrincipal() == req.GetPrincipal()) &&
			(req.GetResource() == "" || r.GetResource() == req.GetResource())
	}
	recs, err := s.st.ListAudit(ctx, after, size+1, match)
	if err != nil {
		return nil, s.storeError(ctx, err, "list audit records", "", "", nil)
	}
	out := &evidencev1.ListAuditRecordsResponse{Records: recs}
	if len(recs) > size {
		out.Records = recs[:size]
		out.NextPageToken = auditToken(recs[size-1].GetSequence(), filter)
	}
	return out, nil
}

// auditFilter identifies a request's filters, so a token is used only
// with the filters it was made for (AIP-158).
func auditFilter(req *evidencev1.ListAuditRecordsRequest) string {
	d, err := digest.JSON([]string{req.GetAction(), req.GetPrincipal(), req.GetResource()})
	if err != nil {
		return ""
	}
	return d[len(d)-16:]
}

// auditToken is an opaque page token: the last sequence served and the
// filters it was served under.
func auditToken(after int64, filter string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(after, 10) + "." + filter))
}

func parseAuditToken(tok, filter string) (int64, error) {
	if tok == "" {
		return 0, nil
	}
	bad := apierror.New(codes.InvalidArgument, "PAGE_TOKEN_INVALID",
		"the page token is not one this list returned for these filters; start again without a token", nil)
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return 0, bad
	}
	seq, f, ok := strings.Cut(string(raw), ".")
	n, err := strconv.ParseInt(seq, 10, 64)
	if !ok || err != nil || n < 0 || f != filter {
		return 0, bad
	}
	return n, nil
}
