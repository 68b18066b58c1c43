package orchestrator

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestRefreshHandles: the requester's refresh mints new handles for the
// offered capabilities and records the catalogue; another person, a
// cancelled task and a request without a task are refused, and a refused
// refresh changes nothing.
func TestRefreshHandles(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	started := h.start(t, "source_review", false)
	task := started.GetTask().GetId()
	old := map[string]bool{}
	for _, ho := range offeredCapability(started.GetCatalogue(), capRetrieveAuthorizedSource).GetHandles() {
		old[ho.GetHandle()] = true
	}
	if len(old) != 2 {
		t.Fatalf("started with %d handles, want one per source", len(old))
	}

	_, err := h.client.RefreshHandles(as(t.Context(), "carol", "authors"), &orchestratorv1.RefreshHandlesRequest{TaskId: task})
	wantErr(t, err, codes.PermissionDenied, "ROLE_NOT_GRANTED")
	_, err = h.client.RefreshHandles(t.Context(), &orchestratorv1.RefreshHandlesRequest{})
	wantErr(t, err, codes.InvalidArgument, "FIELD_REQUIRED")
	if cat, err := h.client.GetCatalogue(t.Context(), &orchestratorv1.GetCatalogueRequest{TaskId: task}); err != nil || !proto.Equal(cat, started.GetCatalogue()) {
		t.Fatalf("a refused refresh changed the catalogue: %v, %v", cat, err)
	}

	cat, err := h.client.RefreshHandles(t.Context(), &orchestratorv1.RefreshHandlesRequest{TaskId: task})
	if err != nil {
		t.Fatalf("RefreshHandles: %v", err)
	}
	if cat.GetRefreshTime() == nil || !proto.Equal(cat.GetCompileTime(), started.GetCatalogue().GetCompileTime()) {
		t.Errorf("refresh time %v, compile time %v; want a refresh time and the compile time kept", cat.GetRefreshTime(), cat.GetCompileTime())
	}
	oc := offeredCapability(cat, capRetrieveAuthorizedSource)
	var labels []string
	for _, ho := range oc.GetHandles() {
		if old[ho.GetHandle()] || ho.GetKind() != registryv1.HandleKind_HANDLE_KIND_SOURCE {
			t.Errorf("refreshed handle %v is an old one or not a source handle", ho)
		}
		labels = append(labels, ho.GetLabel())
	}
	if len(labels) != 2 {
		t.Errorf("refreshed handles %v, want one per source", labels)
	}
	if got := choicesOf(t, oc, "source"); len(got) != 2 || old[got[0]] || old[got[1]] {
		t.Errorf("the schema lists %v, want the two new handles", got)
	}
	if stored, err := h.client.GetCatalogue(t.Context(), &orchestratorv1.GetCatalogueRequest{TaskId: task}); err != nil || !proto.Equal(stored, cat) {
		t.Errorf("GetCatalogue = %v, %v; want the refreshed catalogue", stored, err)
	}
	// The old handles still work until they expire.
	for tok := range old {
		if r, err := h.submit(t, task, "call_old_"+tok[len(tok)-4:], capRetrieveAuthorizedSource, map[string]any{"source": tok}); err != nil ||
			r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
			t.Errorf("an earlier handle after refresh: %v, %v", r.GetState(), err)
		}
	}

	if _, err := h.client.CancelTask(t.Context(), &orchestratorv1.CancelTaskRequest{Id: task}); err != nil {
		t.Fatal(err)
	}
	_, err = h.client.RefreshHandles(t.Context(), &orchestratorv1.RefreshHandlesRequest{TaskId: task})
	wantErr(t, err, codes.FailedPrecondition, "TASK_NOT_ACTIVE")
}

// choicesOf lists the handles the offered schema lists for field.
func choicesOf(t *testing.T, oc *orchestratorv1.OfferedCapability, field string) []string {
	t.Helper()
	var out []string
	for _, c := range oc.GetInputSchema().GetFields()["properties"].GetStructValue().GetFields()[field].GetStructValue().GetFields()["oneOf"].GetListValue().GetValues() {
		out = append(out, c.GetStructValue().GetFields()["const"].GetStringValue())
	}
	return out
}

// TestExportOffersHandlesPerKind: an export task names its artifact and
// destination; policy learns both scopes, and the catalogue offers an
// artifact handle in the artifact field and a destination handle in the
// destination field, and no source handle although the task has sources.
func TestExportOffersHandlesPerKind(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.registry.capabilities[capDeliverApprovedArtifact].Handles = []*registryv1.HandleField{
		{Field: "artifact", RefersTo: "artifact", Kind: registryv1.HandleKind_HANDLE_KIND_ARTIFACT},
		{Field: "destination", RefersTo: "destination", Kind: registryv1.HandleKind_HANDLE_KIND_DESTINATION},
	}
	preview := &orchestratorv1.SourceRef{Uri: "artifact://previews/sha256:4f2a", Title: "Preview r31"}
	site := &orchestratorv1.SourceRef{Uri: "site://docs.example/api"}
	resp, err := h.client.StartTask(t.Context(), &orchestratorv1.StartTaskRequest{
		Profile: "export", SourceScope: []*orchestratorv1.SourceRef{migrationGuide},
		ArtifactScope: []*orchestratorv1.SourceRef{preview}, DestinationScope: []*orchestratorv1.SourceRef{site},
	})
	if err != nil {
		t.Fatalf("StartTask: %v", err)
	}
	h.policy.mu.Lock()
	reg := h.policy.registered[len(h.policy.registered)-1]
	h.policy.mu.Unlock()
	if !slices.Equal(reg.GetArtifactScope(), []string{preview.GetUri()}) || !slices.Equal(reg.GetDestinationScope(), []string{site.GetUri()}) ||
		!slices.Equal(reg.GetSourceScope(), []string{migrationGuide.GetUri()}) {
		t.Errorf("registered %v", reg)
	}
	if !proto.Equal(resp.GetTask().GetArtifactScope()[0], preview) || !proto.Equal(resp.GetTask().GetDestinationScope()[0], site) {
		t.Errorf("task = %v", resp.GetTask())
	}
	oc := offeredCapability(resp.GetCatalogue(), capDeliverApprovedArtifact)
	var got []string
	for _, ho := range oc.GetHandles() {
		got = append(got, ho.GetKind().String()+"="+ho.GetLabel())
	}
	if want := []string{"HANDLE_KIND_ARTIFACT=Preview r31", "HANDLE_KIND_DESTINATION=api"}; !slices.Equal(got, want) {
		t.Errorf("handles = %v, want %v", got, want)
	}
	if len(oc.GetHandleFields()) != 2 || oc.GetHandleFields()[1].GetField() != "destination" ||
		oc.GetHandleFields()[1].GetKind() != registryv1.HandleKind_HANDLE_KIND_DESTINATION {
		t.Errorf("handle fields = %v", oc.GetHandleFields())
	}
	if a, d := choicesOf(t, oc, "artifact"), choicesOf(t, oc, "destination"); len(a) != 1 || len(d) != 1 || a[0] == d[0] {
		t.Errorf("schema lists artifact %v, destination %v", a, d)
	}
	if js := protojson.Format(resp.GetCatalogue()); strings.Contains(js, preview.GetUri()) || strings.Contains(js, site.GetUri()) {
		t.Errorf("the catalogue names a URI: %s", js)
	}
}
