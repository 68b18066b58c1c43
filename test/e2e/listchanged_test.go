package e2e_test

import (
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestListChangedSendsMappingToReview: the server behind a mapped tool
// changes the tool's description at runtime, after one governed call, and
// says so (notifications/tools/list_changed) on the adapter's long-lived
// session. Without any further call, the registry records a new snapshot,
// its drift check sends the mapping to review, and the next governed call
// through it is refused before it reaches the server.
func TestListChangedSendsMappingToReview(t *testing.T) {
	t.Parallel()
	w := &world{t: t, s: startSuite(t, t.TempDir()), callLog: filepath.Join(testkit.WritableDir(t), "calls.jsonl")}
	ctx := testkit.As(w.s, scenario.Integrator)
	w.connect(scenario.StdioFixture(v0m3Bin, "--call-log", w.callLog, "--redescribe-after-calls", "1"))
	task := w.startTask()
	first, err := w.retrieve(task, "call-1")
	if err != nil || first.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("retrieval before the change: %v %v", first.GetState(), err)
	}

	// Waiting for an event the test does not cause: the server's own
	// change. The bound is generous; nothing here measures speed.
	testkit.Eventually(t, "the mapping to need review after the server changed its tool", func() bool {
		return w.mappingNow().GetState() == registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED
	})
	snaps, err := w.s.Registry.ListSnapshots(ctx, &registryv1.ListSnapshotsRequest{ConnectionId: w.conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	all := snaps.GetSnapshots()
	if len(all) != 2 || all[0].GetId() != w.snap.GetId() {
		t.Fatalf("%d snapshots, want the reviewed one and the one after the change", len(all))
	}
	diff, err := w.s.Registry.DiffSnapshots(ctx, &registryv1.DiffSnapshotsRequest{BaseSnapshotId: all[0].GetId(), TargetSnapshotId: all[1].GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if c := toolChange(diff, "search"); c == nil || c.GetKind() != registryv1.ChangeKind_CHANGE_KIND_CHANGED {
		t.Fatalf("diff for search = %v, want CHANGED", c)
	}
	for _, tool := range all[1].GetTools() {
		if tool.GetName() == "search" && tool.GetDescription() != fixture.DescriptionPrivate {
			t.Errorf("new snapshot describes search as %q", tool.GetDescription())
		}
	}

	calls := toolCalls(callLog(t, w.callLog))
	if _, err := w.retrieve(task, "call-2"); !apierror.Is(err, codes.FailedPrecondition, "MAPPING_REVIEW_REQUIRED") {
		t.Fatalf("submit after the change: %v, want FAILED_PRECONDITION MAPPING_REVIEW_REQUIRED", err)
	}
	if n := toolCalls(callLog(t, w.callLog)); n != calls {
		t.Errorf("a refused request reached the server (%d tools/call, want %d)", n, calls)
	}
}
