package e2e_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// registryEvents returns the registry's events of one connection so far
// (up to its latest one, which the test has just caused).
func (w *world) registryEvents(until registryv1.RegistryEventType, snapshotID string) []*registryv1.RegistryEvent {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(testkit.As(w.s, scenario.Reviewer), time.Minute)
	defer cancel()
	stream, err := w.s.Registry.WatchEvents(ctx, &registryv1.WatchEventsRequest{})
	if err != nil {
		w.t.Fatal(err)
	}
	var out []*registryv1.RegistryEvent
	for {
		ev, err := stream.Recv()
		if err != nil {
			w.t.Fatalf("no %v event for snapshot %s: %v", until, snapshotID, err)
		}
		if ev.GetConnectionId() != w.conn.GetId() {
			continue
		}
		out = append(out, ev)
		if ev.GetType() == until && ev.GetSnapshotId() == snapshotID {
			return out
		}
	}
}

func itemChange(changes []*registryv1.ItemChange, name string) *registryv1.ItemChange {
	for _, c := range changes {
		if c.GetName() == name {
			return c
		}
	}
	return nil
}

// TestSurfaceDriftIsReviewed: the server redescribes its resource template
// and prompts, which no mapping depends on: the diff and a SURFACE_CHANGED
// event show it and the mapping stays active. Then the search tool's
// annotations turn destructive with nothing else changed: the active
// mapping needs review, and no call reaches the server until a person
// reviews it.
func TestSurfaceDriftIsReviewed(t *testing.T) {
	t.Parallel()
	w := newHTTPWorld(t, "--surface", "v1")
	ctx := testkit.As(w.s, scenario.Integrator)
	if len(w.snap.GetResourceTemplates()) != 1 || w.snap.GetResourceTemplates()[0].GetUriTemplate() != fixture.SurfaceTemplate ||
		len(w.snap.GetPrompts()) != 1 || w.snap.GetPrompts()[0].GetName() != "summarize-note" {
		t.Fatalf("first snapshot: templates %v, prompts %v", w.snap.GetResourceTemplates(), w.snap.GetPrompts())
	}

	// Templates and prompts change; no mapping depends on them.
	w.restartFixture("--surface", "v2")
	snap2 := w.discover()
	diff, err := w.s.Registry.DiffSnapshots(ctx, &registryv1.DiffSnapshotsRequest{BaseSnapshotId: w.snap.GetId(), TargetSnapshotId: snap2.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if len(diff.GetTools()) != 0 || len(diff.GetResources()) != 0 {
		t.Errorf("tools %v and resources %v changed, want neither", diff.GetTools(), diff.GetResources())
	}
	if c := itemChange(diff.GetResourceTemplates(), fixture.SurfaceTemplate); c.GetKind() != registryv1.ChangeKind_CHANGE_KIND_CHANGED ||
		!slices.Equal(c.GetChangedDigests(), []string{"description_digest"}) {
		t.Errorf("template change = %v, want CHANGED description_digest", c)
	}
	if c := itemChange(diff.GetPrompts(), "summarize-note"); c.GetKind() != registryv1.ChangeKind_CHANGE_KIND_CHANGED ||
		!slices.Equal(c.GetChangedDigests(), []string{"arguments_digest"}) {
		t.Errorf("summarize-note change = %v, want CHANGED arguments_digest", c)
	}
	if c := itemChange(diff.GetPrompts(), "compare-notes"); c.GetKind() != registryv1.ChangeKind_CHANGE_KIND_ADDED {
		t.Errorf("compare-notes change = %v, want ADDED", c)
	}
	evs := w.registryEvents(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_SURFACE_CHANGED, snap2.GetId())
	detail := evs[len(evs)-1].GetDetail()
	for _, want := range []string{`prompts added: "compare-notes"`, `"summarize-note" (arguments_digest)`, `"` + fixture.SurfaceTemplate + `" (description_digest)`} {
		if !strings.Contains(detail, want) {
			t.Errorf("SURFACE_CHANGED detail %q does not say %q", detail, want)
		}
	}
	if strings.Contains(detail, fixture.SurfaceTemplateV2) || strings.Contains(detail, "Who the summary is for") {
		t.Errorf("remote description text entered the event: %q", detail)
	}
	if st := w.mappingNow().GetState(); st != registryv1.MappingState_MAPPING_STATE_ACTIVE {
		t.Fatalf("mapping after template and prompt changes is %v, want still ACTIVE", st)
	}
	task := w.startTask()
	if got, err := w.retrieve(task, "call-1"); err != nil || got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("retrieval after template and prompt changes: %v %v", got, err)
	}

	// The same tool, the same schema and description, now annotated
	// destructive.
	w.restartFixture("--surface", "v2", "--annotations", "destructive")
	snap3 := w.discover()
	diff, err = w.s.Registry.DiffSnapshots(ctx, &registryv1.DiffSnapshotsRequest{BaseSnapshotId: snap2.GetId(), TargetSnapshotId: snap3.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if c := toolChange(diff, "search"); c.GetKind() != registryv1.ChangeKind_CHANGE_KIND_CHANGED ||
		!slices.Equal(c.GetChangedDigests(), []string{"annotations_digest"}) {
		t.Fatalf("search change = %v, want CHANGED annotations_digest only", c)
	}
	m := w.mappingNow()
	if m.GetState() != registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED || !strings.Contains(m.GetStateReason(), "annotations_digest") {
		t.Fatalf("mapping after the annotations changed: %v %q, want REVIEW_REQUIRED naming annotations_digest", m.GetState(), m.GetStateReason())
	}
	evs = w.registryEvents(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_REVIEW_REQUIRED, snap3.GetId())
	if last := evs[len(evs)-1]; last.GetMappingId() != m.GetId() || !strings.Contains(last.GetDetail(), "annotations_digest") {
		t.Errorf("review event = %v", last)
	}
	calls := toolCalls(callLog(t, w.callLog))
	if _, err := w.retrieve(task, "call-2"); !apierror.Is(err, codes.FailedPrecondition, "MAPPING_REVIEW_REQUIRED") {
		t.Fatalf("submit through a mapping whose tool turned destructive: %v, want MAPPING_REVIEW_REQUIRED", err)
	}
	if n := toolCalls(callLog(t, w.callLog)); n != calls {
		t.Errorf("a refused request reached the server (%d tools/call, want %d)", n, calls)
	}
	// A reviewed revision against the new snapshot records what was judged.
	rev2 := w.review(w.propose(w.mapping.GetId(), snap3, "search", "query"))
	if rev2.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE || rev2.GetTargetDigests().GetAnnotationsDigest() != snap3.GetTools()[0].GetAnnotationsDigest() {
		t.Fatalf("reviewed revision %v with target digests %v", rev2.GetState(), rev2.GetTargetDigests())
	}
}
