package evidence

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// MaxAssetBytes bounds one asset.
const MaxAssetBytes = 32 << 20

// AssetStore keeps content by its digest. It is separate from Store: assets
// are large, immutable and content-addressed, so they belong in a blob
// store (a directory here; an object store in a cluster), while Store keeps
// small records. Put of content already present is a no-op.
type AssetStore interface {
	// Put stores content under its digest, with its media type.
	Put(ctx context.Context, digest, mediaType string, content []byte) error
	// Get returns the content and media type stored under digest, or
	// store.ErrNotFound.
	Get(ctx context.Context, digest string) (content []byte, mediaType string, err error)
	// Has reports whether digest is stored.
	Has(ctx context.Context, digest string) (bool, error)
}

// dirAssets is an AssetStore in a directory: one file per asset named by
// its hex digest, written atomically (temp file, then rename), and one
// ".type" file beside it with the media type.
type dirAssets struct{ dir string }

// NewDirAssetStore returns an AssetStore keeping files in dir, creating it.
func NewDirAssetStore(dir string) (AssetStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("evidence: asset dir: %w", err)
	}
	return &dirAssets{dir: dir}, nil
}

func (d *dirAssets) path(dg string) (string, error) {
	hex, ok := strings.CutPrefix(dg, "sha256:")
	if !ok || !contentDigestPattern.MatchString(dg) {
		return "", fmt.Errorf("evidence: not a content digest")
	}
	return filepath.Join(d.dir, hex), nil
}

func (d *dirAssets) Put(ctx context.Context, dg, mediaType string, content []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := d.path(dg)
	if err != nil {
		return err
	}
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	for _, f := range []struct {
		path string
		data []byte
	}{{p + ".type", []byte(mediaType)}, {p, content}} {
		tmp, err := os.CreateTemp(d.dir, ".tmp-")
		if err != nil {
			return fmt.Errorf("evidence: put asset: %w", err)
		}
		_, werr := tmp.Write(f.data)
		cerr := tmp.Close()
		if err := errors.Join(werr, cerr); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("evidence: put asset: %w", err)
		}
		if err := os.Rename(tmp.Name(), f.path); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("evidence: put asset: %w", err)
		}
	}
	return nil
}

func (d *dirAssets) Get(ctx context.Context, dg string) ([]byte, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	p, err := d.path(dg)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", store.ErrNotFound, err)
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", store.ErrNotFound
	}
	if err != nil {
		return nil, "", fmt.Errorf("evidence: get asset: %w", err)
	}
	// The file is named by its digest; content that no longer matches it
	// was changed behind the store's back and is not returned.
	if digest.Bytes(b) != dg {
		return nil, "", fmt.Errorf("evidence: asset %s does not match its digest", dg)
	}
	mt, _ := os.ReadFile(p + ".type")
	return b, string(mt), nil
}

func (d *dirAssets) Has(ctx context.Context, dg string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	p, err := d.path(dg)
	if err != nil {
		return false, nil
	}
	_, err = os.Stat(p)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("evidence: stat asset: %w", err)
	}
}

// PutAsset stores content by its digest. The same content stored again
// returns the same asset.
func (s *Server) PutAsset(ctx context.Context, req *evidencev1.PutAssetRequest) (*evidencev1.Asset, error) {
	if s.assets == nil {
		return nil, apierror.New(codes.FailedPrecondition, "ASSETS_NOT_CONFIGURED", "this evidence service stores no assets", nil)
	}
	var vs []apierror.FieldViolation
	if len(req.GetContent()) == 0 {
		vs = append(vs, apierror.FieldViolation{Field: "content", Description: "required"})
	}
	if len(req.GetContent()) > MaxAssetBytes {
		vs = append(vs, apierror.FieldViolation{Field: "content", Description: fmt.Sprintf("larger than %d bytes", MaxAssetBytes)})
	}
	if req.GetMediaType() == "" {
		vs = append(vs, apierror.FieldViolation{Field: "media_type", Description: "required"})
	}
	dg := digest.Bytes(req.GetContent())
	if e := req.GetExpectedDigest(); e != "" && e != dg {
		vs = append(vs, apierror.FieldViolation{Field: "expected_digest", Description: "does not match the content"})
	}
	if len(vs) > 0 {
		return nil, apierror.InvalidArgument("ASSET_INVALID", "the asset is empty, too large or does not match its digest", vs...)
	}
	if err := s.assets.Put(ctx, dg, req.GetMediaType(), req.GetContent()); err != nil {
		return nil, s.storeError(ctx, err, "put asset", "", "", nil)
	}
	s.log.InfoContext(ctx, "asset stored", "digest", dg, "size_bytes", len(req.GetContent()))
	return &evidencev1.Asset{Digest: dg, MediaType: req.GetMediaType(), SizeBytes: int64(len(req.GetContent()))}, nil
}

// GetAsset returns an asset's content.
func (s *Server) GetAsset(ctx context.Context, req *evidencev1.GetAssetRequest) (*evidencev1.Asset, error) {
	if err := s.require(ctx, authz.TraceRead, "asset", req.GetDigest()); err != nil {
		return nil, err
	}
	if req.GetDigest() == "" {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "a digest is required", apierror.FieldViolation{Field: "digest", Description: "required"})
	}
	if s.assets == nil {
		return nil, apierror.New(codes.FailedPrecondition, "ASSETS_NOT_CONFIGURED", "this evidence service stores no assets", nil)
	}
	b, mt, err := s.assets.Get(ctx, req.GetDigest())
	if err != nil {
		return nil, s.storeError(ctx, err, "get asset", "ASSET_UNKNOWN", "no asset has this digest", map[string]string{"digest": req.GetDigest()})
	}
	return &evidencev1.Asset{Digest: req.GetDigest(), MediaType: mt, SizeBytes: int64(len(b)), Content: b}, nil
}
