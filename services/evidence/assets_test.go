package evidence_test

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/services/evidence"
)

func newAssetEnv(t *testing.T, maxInline int64) *env {
	t.Helper()
	assets, err := evidence.NewDirAssetStore(filepath.Join(t.TempDir(), "assets"))
	if err != nil {
		t.Fatal(err)
	}
	return startEnv(t, filepath.Join(t.TempDir(), "evidence.db"), testkit.NewClock(t0), func(s *evidence.Server) {
		s.WithAssets(assets).WithMaxInlineBytes(maxInline)
	})
}

// TestLargeContentAsAsset: content over the inline bound is refused inline
// (OBSERVATION_TOO_LARGE) and recorded once stored as an asset by digest;
// the observation's passages keep their identity, digest and position,
// and the asset returns the exact content.
func TestLargeContentAsAsset(t *testing.T) {
	t.Parallel()
	e := newAssetEnv(t, 1024)
	p1 := "# Big note"
	p2 := strings.Repeat("Every request counts against the limit. ", 100)
	content := p1 + "\n\n" + p2 + "\n"

	inline := observation("task_a", "conn_a", "notes://big", content)
	inline.Passages = []*evidencev1.Passage{{PassageId: "p1", Text: p1}, {PassageId: "p2", Text: p2, Index: 1}}
	_, err := e.client.RecordObservation(t.Context(), &evidencev1.RecordObservationRequest{Observation: inline})
	wantError(t, err, codes.ResourceExhausted, "OBSERVATION_TOO_LARGE")

	ref := observation("task_a", "conn_a", "notes://big", content)
	ref.AssetDigest = ref.GetContentDigest()
	ref.Passages = []*evidencev1.Passage{
		{PassageId: "p1", TextDigest: contentDigest(p1), AssetOffset: 0, AssetLength: int64(len(p1))},
		{PassageId: "p2", Index: 1, TextDigest: contentDigest(p2), AssetOffset: int64(len(p1) + 2), AssetLength: int64(len(p2))},
	}
	_, err = e.client.RecordObservation(t.Context(), &evidencev1.RecordObservationRequest{Observation: ref})
	wantError(t, err, codes.FailedPrecondition, "ASSET_UNKNOWN")

	a, err := e.client.PutAsset(t.Context(), &evidencev1.PutAssetRequest{Content: []byte(content), MediaType: "text/markdown", ExpectedDigest: ref.GetContentDigest()})
	if err != nil || a.GetDigest() != ref.GetContentDigest() || a.GetSizeBytes() != int64(len(content)) {
		t.Fatalf("PutAsset = %v, %v", a, err)
	}
	again, err := e.client.PutAsset(t.Context(), &evidencev1.PutAssetRequest{Content: []byte(content), MediaType: "text/markdown"})
	if err != nil || again.GetDigest() != a.GetDigest() {
		t.Errorf("PutAsset again = %v, %v", again, err)
	}
	_, err = e.client.PutAsset(t.Context(), &evidencev1.PutAssetRequest{Content: []byte(content), MediaType: "text/markdown", ExpectedDigest: contentDigest("x")})
	wantError(t, err, codes.InvalidArgument, "ASSET_INVALID", "expected_digest")

	obs := record(t, e, ref)
	link, err := e.client.LinkClaim(t.Context(), &evidencev1.LinkClaimRequest{ClaimId: "claim_big", ObservationId: obs.GetId(), PassageId: "p2"})
	if err != nil || link.GetRevisionId() != obs.GetRevisionId() {
		t.Fatalf("LinkClaim on an asset-backed observation = %v, %v", link, err)
	}
	got, err := e.client.GetAsset(t.Context(), &evidencev1.GetAssetRequest{Digest: obs.GetAssetDigest()})
	if err != nil || !bytes.Equal(got.GetContent(), []byte(content)) || got.GetMediaType() != "text/markdown" {
		t.Fatalf("GetAsset = %v, %v", got, err)
	}
	ps := obs.GetPassages()[1]
	if quoted := string(got.GetContent()[ps.GetAssetOffset() : ps.GetAssetOffset()+ps.GetAssetLength()]); contentDigest(quoted) != ps.GetTextDigest() {
		t.Errorf("passage p2 at its asset position does not match its digest")
	}
	_, err = e.client.GetAsset(t.Context(), &evidencev1.GetAssetRequest{Digest: contentDigest("never stored")})
	wantError(t, err, codes.NotFound, "ASSET_UNKNOWN")
}

// TestAssetsNotConfigured: without an asset store, assets are refused.
func TestAssetsNotConfigured(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, err := e.client.PutAsset(t.Context(), &evidencev1.PutAssetRequest{Content: []byte("x"), MediaType: "text/plain"})
	wantError(t, err, codes.FailedPrecondition, "ASSETS_NOT_CONFIGURED")
}
