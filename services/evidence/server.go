package evidence

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// Server implements evidencev1.EvidenceServiceServer over a Store. It is the
// single writer of evidence state.
type Server struct {
	evidencev1.UnimplementedEvidenceServiceServer

	st  Store
	log *slog.Logger
	now func() time.Time

	// assets holds content stored by digest; nil means none are accepted.
	assets AssetStore
	// maxInline bounds the quoted text one observation may hold inline.
	maxInline int64
	// authz decides what people and product services may do here.
	authz authz.Decider
	// creds verify the adapter's receipt attestations; nil (plaintext
	// development) stores receipts unverified.
	creds *identity.Credentials
}

// NewServer returns an evidence server persisting to st and logging to log.
func NewServer(st Store, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{st: st, log: log, now: time.Now, maxInline: DefaultMaxInlineBytes}
}

// DefaultMaxInlineBytes bounds the passage text one observation holds
// inline. Larger content is recorded only as an asset (when its mapping
// allows asset references); otherwise it is refused, and the caller records
// that the result was not recorded.
const DefaultMaxInlineBytes = 256 << 10

// WithAssets gives the server an asset store (see PutAsset) and returns it.
func (s *Server) WithAssets(a AssetStore) *Server {
	s.assets = a
	return s
}

// WithMaxInlineBytes replaces DefaultMaxInlineBytes and returns the server.
func (s *Server) WithMaxInlineBytes(n int64) *Server {
	if n > 0 {
		s.maxInline = n
	}
	return s
}

// WithCredentials gives the server its service credentials and returns
// it: RecordReceipt then stores only receipts the adapter attested (see
// internal/receipt). Without them (plaintext development, where
// no peer is authenticated) receipts are stored unverified, and the
// orchestrator never trusts one it reads back.
func (s *Server) WithCredentials(c *identity.Credentials) *Server {
	s.creds = c
	return s
}

// WithClock replaces the server's clock (for tests) and returns the server.
func (s *Server) WithClock(now func() time.Time) *Server {
	s.now = now
	return s
}

func (s *Server) timestamp() *timestamppb.Timestamp { return timestamppb.New(s.now().UTC()) }

// storeError turns a store failure into the error a client sees: NOT_FOUND
// with reason when the record is missing, the context's own status when the
// call was cancelled, INTERNAL otherwise. The internal cause is logged, not
// returned, so storage details never reach a client.
func (s *Server) storeError(ctx context.Context, err error, op, notFoundReason, notFoundMsg string, md map[string]string) error {
	switch {
	case notFoundReason != "" && errors.Is(err, store.ErrNotFound):
		return apierror.New(codes.NotFound, notFoundReason, notFoundMsg, md)
	case errors.Is(err, context.Canceled):
		return apierror.New(codes.Canceled, "CANCELLED", "the call was cancelled", nil)
	case errors.Is(err, context.DeadlineExceeded):
		return apierror.New(codes.DeadlineExceeded, "DEADLINE_EXCEEDED", "the call ran out of time", nil)
	}
	s.log.ErrorContext(ctx, "store failure", "op", op, "err", err)
	return apierror.Store(apierror.ReasonStoreFailure, "the evidence store failed", err)
}

// required appends a violation for each empty field.
func required(vs []apierror.FieldViolation, fields ...[2]string) []apierror.FieldViolation {
	for _, f := range fields {
		if f[1] == "" {
			vs = append(vs, apierror.FieldViolation{Field: f[0], Description: "required"})
		}
	}
	return vs
}
