package adapter_test

import (
	"path/filepath"
	"sync"
	"testing"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestThirdPartyEverythingOneProcess: Node's server-everything over stdio
// serves sequential and concurrent governed calls from one process (its
// start costs about a second); closing the adapter ends it.
func TestThirdPartyEverythingOneProcess(t *testing.T) {
	t.Parallel()
	dir := thirdPartyDir(t)
	tp := startThirdParty(t)
	conn, snap := tp.connect(t, "server-everything", filepath.Join(dir, "server-everything", "dist", "index.js"), "stdio")
	const doc = "demo://resource/static/document/architecture.md"
	target := &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_RESOURCE, Name: doc}
	limits := &registryv1.Limits{MaxResponseBytes: 256 << 10, MaxItems: 1, AllowedMediaTypes: []string{"text/markdown"}}
	m := tp.activate(t, conn, snap, target, nil, limits)
	// Discovery ran its own process, which is gone.
	base := tp.ad.ProcessStarts()

	for range 3 {
		if resp := tp.execute(t, conn, m, target, nil, m.GetLimits()); resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
			t.Fatalf("outcome %v error %v", resp.GetOutcome(), resp.GetError())
		}
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if resp := tp.execute(t, conn, m, target, nil, m.GetLimits()); resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
				t.Errorf("concurrent call: outcome %v error %v", resp.GetOutcome(), resp.GetError())
			}
		})
	}
	wg.Wait()
	// A response over a small limit is refused without costing the
	// session its process.
	wantCode(t, tp.execute(t, conn, m, target, nil, &registryv1.Limits{MaxResponseBytes: 512, MaxItems: 1, AllowedMediaTypes: []string{"text/markdown"}}),
		"RESPONSE_LIMIT_EXCEEDED")
	if resp := tp.execute(t, conn, m, target, nil, m.GetLimits()); resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("after the refusal: outcome %v error %v", resp.GetOutcome(), resp.GetError())
	}
	if got := tp.ad.ProcessStarts() - base; got != 1 {
		t.Errorf("13 calls started %d server-everything processes, want 1", got)
	}
	if err := tp.ad.Close(); err != nil {
		t.Fatal(err)
	}
	if n := tp.ad.ProcessesLive(); n != 0 {
		t.Errorf("%d server processes left after Close", n)
	}
}
