package controller_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/v0m3/v0m3/internal/identity"
	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	"github.com/v0m3/v0m3/operator/controller"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// platformEngineer declares definitions through the registry's API, as a
// person of the group the default policy lets do so.
const platformEngineer = "ines@platform"

// defFixture reconciles Capabilities and TaskProfiles directly, against
// the real kube-apiserver and the real registry. The resources are
// cluster-scoped and the registry is shared: every test uses names of its
// own.
type defFixture struct {
	t      *testing.T
	ctx    context.Context
	caps   *controller.CapabilityReconciler
	profs  *controller.TaskProfileReconciler
	events *recorder
}

func newDefFixture(t *testing.T) *defFixture {
	t.Helper()
	needCluster(t)
	ev := &recorder{}
	return &defFixture{
		t:      t,
		ctx:    context.Background(),
		events: ev,
		caps:   &controller.CapabilityReconciler{Client: k8s, Registry: registry, Events: ev},
		profs:  &controller.TaskProfileReconciler{Client: k8s, Registry: registry, Events: ev},
	}
}

// rawJSON encodes v for a RawExtension field.
func rawJSON(t *testing.T, v any) runtime.RawExtension {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return runtime.RawExtension{Raw: b}
}

// projectFileCapability is a retrieval capability reading one project file
// named by a handle: what issue 13's read_project_file declares.
func projectFileCapability(t *testing.T, name string) *v1alpha1.Capability {
	return &v1alpha1.Capability{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.CapabilitySpec{
			EffectClass: v1alpha1.EffectRetrieval,
			InputSchema: rawJSON(t, map[string]any{
				"type": "object",
				"properties": map[string]any{
					"file":  map[string]any{"$ref": "#/$defs/handle"},
					"lines": map[string]any{"type": "integer", "minimum": 1, "maximum": 400},
				},
				"required": []any{"file"},
				"$defs":    map[string]any{"handle": map[string]any{"type": "string", "minLength": 1}},
			}),
			Description:   "Read one file of the project the task is about and quote what it says.",
			Preconditions: []string{"the file is within the task's source scope"},
			ResultState:   "quoted excerpts of the file at one content digest",
			RetryRule:     v1alpha1.RetryRetry,
			Handles:       []v1alpha1.HandleField{{Field: "file", RefersTo: "source", Kind: v1alpha1.HandleDestination}},
			ResultKind:    v1alpha1.ResultSourceObservation,
			DefaultLimits: &v1alpha1.Limits{MaxResponseBytes: 65536, MaxItems: 8, AllowedMediaTypes: []string{"text/plain"}},
			Approval:      v1alpha1.ApprovalPolicy,
		},
	}
}

func (f *defFixture) create(obj client.Object) {
	f.t.Helper()
	if err := k8s.Create(f.ctx, obj); err != nil {
		f.t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
	f.t.Cleanup(func() {
		// Leave nothing behind for the next run of the same process: drop
		// the finalizer and delete.
		ctx := context.Background()
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return
		}
		obj.SetFinalizers(nil)
		_ = k8s.Update(ctx, obj)
		_ = k8s.Delete(ctx, obj)
	})
}

// reconcileCap reconciles one Capability and fails on an error.
func (f *defFixture) reconcileCap(name string) reconcile.Result {
	f.t.Helper()
	res, err := f.caps.Reconcile(f.ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
	if err != nil {
		f.t.Fatalf("reconcile Capability %s: %v", name, err)
	}
	return res
}

func (f *defFixture) reconcileProfile(name string) reconcile.Result {
	f.t.Helper()
	res, err := f.profs.Reconcile(f.ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
	if err != nil {
		f.t.Fatalf("reconcile TaskProfile %s: %v", name, err)
	}
	return res
}

func (f *defFixture) capability(name string) *v1alpha1.Capability {
	f.t.Helper()
	var c v1alpha1.Capability
	if err := k8s.Get(f.ctx, types.NamespacedName{Name: name}, &c); err != nil {
		f.t.Fatalf("get Capability %s: %v", name, err)
	}
	return &c
}

func (f *defFixture) profile(name string) *v1alpha1.TaskProfile {
	f.t.Helper()
	var p v1alpha1.TaskProfile
	if err := k8s.Get(f.ctx, types.NamespacedName{Name: name}, &p); err != nil {
		f.t.Fatalf("get TaskProfile %s: %v", name, err)
	}
	return &p
}

// registered reads a capability from the registry at its current revision.
func (f *defFixture) registered(name string) *registryv1.Capability {
	f.t.Helper()
	c, err := registry.GetCapability(f.ctx, &registryv1.GetCapabilityRequest{Name: name})
	if err != nil {
		f.t.Fatalf("GetCapability %s: %v", name, err)
	}
	return c
}

func (f *defFixture) edit(obj client.Object, mutate func()) {
	f.t.Helper()
	if err := k8s.Get(f.ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		f.t.Fatal(err)
	}
	mutate()
	if err := k8s.Update(f.ctx, obj); err != nil {
		f.t.Fatalf("update %s: %v", obj.GetName(), err)
	}
}

func (f *defFixture) delete(obj client.Object) {
	f.t.Helper()
	if err := k8s.Delete(f.ctx, obj); err != nil {
		f.t.Fatalf("delete %s: %v", obj.GetName(), err)
	}
}

func (f *defFixture) gone(obj client.Object) {
	f.t.Helper()
	if err := k8s.Get(f.ctx, client.ObjectKeyFromObject(obj), obj); !apierrors.IsNotFound(err) {
		f.t.Errorf("get %s after delete = %v (finalizers %v); want NotFound", obj.GetName(), err, obj.GetFinalizers())
	}
}

func cond(conds []metav1.Condition, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(conds, typ); c != nil {
		return *c
	}
	return metav1.Condition{Type: typ, Status: "missing"}
}

// A Capability resource appears in the registry as the operator declared
// it: revision 1, managed by the resource, references resolved, and its
// revision, schema digest and conditions in status. Reconciling again
// changes nothing, in Kubernetes or in the registry.
func TestCapabilityDeclared(t *testing.T) {
	t.Parallel()
	f := newDefFixture(t)
	f.create(projectFileCapability(t, "read-project-file"))
	if res := f.reconcileCap("read-project-file"); res.RequeueAfter <= 0 {
		t.Errorf("result %+v; want a resync to notice registry-side changes", res)
	}

	got := f.registered("read_project_file")
	if got.GetRevision() != 1 || got.GetState() != registryv1.DefinitionState_DEFINITION_STATE_ACTIVE ||
		got.GetManagedBy() != "kubernetes/capabilities.v0m3.dev/read-project-file" ||
		got.GetCreatedBy() != identity.ServiceURI(identity.Operator) ||
		got.GetEffectClass() != registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL ||
		got.GetRetryRule() != registryv1.RetryRule_RETRY_RULE_RETRY ||
		got.GetResultKind() != registryv1.ResultKind_RESULT_KIND_SOURCE_OBSERVATION ||
		got.GetApproval() != registryv1.ApprovalRequirement_APPROVAL_REQUIREMENT_POLICY ||
		len(got.GetHandles()) != 1 || got.GetHandles()[0].GetField() != "file" || got.GetHandles()[0].GetRefersTo() != "source" || got.GetHandles()[0].GetKind() != registryv1.HandleKind_HANDLE_KIND_DESTINATION ||
		got.GetDefaultLimits().GetMaxItems() != 8 || got.GetDescription() != projectFileCapability(t, "x").Spec.Description {
		t.Errorf("registry holds %v; want the resource's contract at revision 1, managed by it, created by the operator", got)
	}
	file := got.GetInputSchema().GetFields()["properties"].GetStructValue().GetFields()["file"].GetStructValue()
	if file.GetFields()["type"].GetStringValue() != "string" || got.GetInputSchema().GetFields()["$defs"] != nil {
		t.Errorf("stored schema %v; want the $ref resolved and $defs dropped", got.GetInputSchema())
	}

	c := f.capability("read-project-file")
	if c.Status.RegistryName != "read_project_file" || c.Status.Revision != 1 || c.Status.AcceptedGeneration != c.Generation ||
		c.Status.InputSchemaDigest != got.GetInputSchemaDigest() || !strings.HasPrefix(c.Status.InputSchemaDigest, "sha256:") ||
		c.Status.State != "Active" || c.Status.ManagedBy != got.GetManagedBy() || c.Status.ObservedGeneration != c.Generation || c.Status.Refusal != nil {
		t.Errorf("status = %+v; want registry name, revision 1 and the registry's digest", c.Status)
	}
	if a := cond(c.Status.Conditions, v1alpha1.ConditionAccepted); a.Status != metav1.ConditionTrue || a.Reason != v1alpha1.ReasonRevisionRecorded {
		t.Errorf("Accepted = %+v; want True/RevisionRecorded", a)
	}
	if r := cond(c.Status.Conditions, v1alpha1.ConditionReady); r.Status != metav1.ConditionTrue || r.Reason != v1alpha1.ReasonInForce {
		t.Errorf("Ready = %+v; want True/InForce", r)
	}
	if r := cond(c.Status.Conditions, v1alpha1.ConditionReviewRequired); r.Status != metav1.ConditionFalse || r.Reason != v1alpha1.ReasonNothingToReview {
		t.Errorf("ReviewRequired = %+v; want False/NothingToReview", r)
	}
	if !slices.Contains(c.Finalizers, controller.DefinitionFinalizer) {
		t.Errorf("finalizers = %v; want %s", c.Finalizers, controller.DefinitionFinalizer)
	}
	if !f.events.has("Declared") {
		t.Errorf("events = %v; want Declared", f.events.events)
	}

	rv := c.ResourceVersion
	n := len(f.events.events)
	f.reconcileCap("read-project-file")
	f.reconcileCap("read-project-file")
	if again := f.capability("read-project-file"); again.ResourceVersion != rv {
		t.Errorf("resourceVersion %s -> %s; a settled reconcile must not write", rv, again.ResourceVersion)
	}
	if again := f.registered("read_project_file"); again.GetRevision() != 1 {
		t.Errorf("registry revision after re-reconciling = %d; want 1 (an identical contract is a no-op)", again.GetRevision())
	}
	if len(f.events.events) != n {
		t.Errorf("events after settled reconciles: %v; want none new", f.events.events[n:])
	}
}

// mappingFor declares a reviewed mapping of capability onto a connection's
// read_text_file tool, the way a platform engineer and a reviewer would:
// the connection created by the operator peer and approved, a snapshot
// recorded by the adapter peer, the mapping proposed by one person and
// approved by another.
func mappingFor(t *testing.T, capability string) *registryv1.Mapping {
	t.Helper()
	ctx := context.Background()
	conn, err := registry.CreateConnection(ctx, &registryv1.CreateConnectionRequest{
		DisplayName: "project files " + capability,
		Owner:       "team-platform",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{
			StreamableHttp: &registryv1.StreamableHTTPTransport{Url: "http://files-" + strings.ReplaceAll(capability, "_", "-") + ".mcp.svc:8080/mcp"}}},
	})
	if err != nil {
		t.Fatalf("CreateConnection: %v", err)
	}
	if conn, err = services.ApproveConnection(ctx, conn); err != nil {
		t.Fatal(err)
	}
	adapter, err := services.PeerClients(identity.Adapter)
	if err != nil {
		t.Fatal(err)
	}
	schema, err := structpb.NewStruct(map[string]any{
		"type":       "object",
		"properties": map[string]any{"path": map[string]any{"type": "string"}},
		"required":   []any{"path"},
	})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := adapter.Registry.RecordSnapshot(ctx, &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{
		ConnectionId:    conn.GetId(),
		ConfigRevision:  conn.GetConfigRevision(),
		ServerInfo:      &registryv1.ServerInfo{Name: "secure-filesystem-server", Version: "0.2.0"},
		ProtocolVersion: "2025-06-18",
		Tools:           []*registryv1.ToolIdentity{{Name: "read_text_file", Description: "Read a text file.", InputSchema: schema}},
	}})
	if err != nil {
		t.Fatalf("RecordSnapshot: %v", err)
	}
	m, err := services.Registry.ProposeMapping(services.As(ctx, platformEngineer, "platform"), &registryv1.ProposeMappingRequest{
		Capability:   capability,
		ConnectionId: conn.GetId(),
		SnapshotId:   snap.GetId(),
		Target:       &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "read_text_file"},
		ArgumentMap:  []*registryv1.ArgumentBinding{{RemoteField: "path", ProductField: "file", FromHandle: true}},
	})
	if err != nil {
		t.Fatalf("ProposeMapping: %v", err)
	}
	m, err = services.Registry.ReviewMapping(services.As(ctx, "rita@review", "reviewers"), &registryv1.ReviewMappingRequest{
		MappingId: m.GetId(), Revision: m.GetRevision(), Approve: true, Note: "reads one file named by a handle"})
	if err != nil || m.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE {
		t.Fatalf("ReviewMapping = %v, %v; want ACTIVE", m, err)
	}
	return m
}

// Editing a Capability's spec declares a new revision, and the registry
// sends the active mapping of the old contract to review; the resource
// shows the new revision and the mapping waiting, and a person (not the
// operator) reviews it.
func TestCapabilityEditRevisesAndSendsMappingToReview(t *testing.T) {
	t.Parallel()
	f := newDefFixture(t)
	c := projectFileCapability(t, "read-project-notes")
	f.create(c)
	f.reconcileCap("read-project-notes")
	m := mappingFor(t, "read_project_notes")
	f.reconcileCap("read-project-notes")
	if r := cond(f.capability("read-project-notes").Status.Conditions, v1alpha1.ConditionReviewRequired); r.Status != metav1.ConditionFalse {
		t.Fatalf("ReviewRequired with an active mapping = %+v; want False", r)
	}

	f.edit(c, func() { c.Spec.Description += " Quote at most three passages." })
	f.reconcileCap("read-project-notes")

	got := f.registered("read_project_notes")
	if got.GetRevision() != 2 || !strings.HasSuffix(got.GetDescription(), "three passages.") {
		t.Errorf("registry holds %v; want revision 2 with the new description", got)
	}
	if prev, err := registry.GetCapability(f.ctx, &registryv1.GetCapabilityRequest{Name: "read_project_notes", Revision: 1}); err != nil ||
		strings.Contains(prev.GetDescription(), "three passages") {
		t.Errorf("revision 1 = %v, %v; want it kept as it was", prev, err)
	}
	mapping, err := registry.GetMapping(f.ctx, &registryv1.GetMappingRequest{Id: m.GetId()})
	if err != nil || mapping.GetState() != registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED {
		t.Errorf("mapping after the revision = %v, %v; want REVIEW_REQUIRED", mapping, err)
	}
	c = f.capability("read-project-notes")
	if c.Status.Revision != 2 || c.Status.AcceptedGeneration != c.Generation || c.Status.MappingsNeedingReview != 1 {
		t.Errorf("status = %+v; want revision 2 and one mapping needing review", c.Status)
	}
	if r := cond(c.Status.Conditions, v1alpha1.ConditionReviewRequired); r.Status != metav1.ConditionTrue ||
		r.Reason != v1alpha1.ReasonMappingsNeedReview || !strings.Contains(r.Message, m.GetId()) {
		t.Errorf("ReviewRequired = %+v; want True/MappingsNeedReview naming the mapping", r)
	}
	if !f.events.has("Revised") || !f.events.has(v1alpha1.ReasonMappingsNeedReview) {
		t.Errorf("events = %v; want Revised and MappingsNeedReview", f.events.events)
	}
}

// A spec the registry refuses gets Accepted=False with the registry's
// reason and its field violations as spec paths. The refusal is terminal:
// no error, no requeue, nothing in the registry. Fixing the spec declares
// it.
func TestCapabilityRefusedByRegistry(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		mutate    func(*v1alpha1.Capability)
		reason    string // the registry's ErrorInfo reason
		condition string
		fields    []string
	}{
		{
			name:      "refused-schema-not-object",
			mutate:    func(c *v1alpha1.Capability) { c.Spec.InputSchema = rawJSON(t, map[string]any{"type": "string"}) },
			reason:    "INVALID_SCHEMA",
			condition: "InvalidSchema",
			fields:    []string{"spec.inputSchema"},
		},
		{
			name: "refused-schema-remote-ref",
			mutate: func(c *v1alpha1.Capability) {
				c.Spec.InputSchema = rawJSON(t, map[string]any{"type": "object", "properties": map[string]any{
					"file": map[string]any{"$ref": "https://schemas.example.com/file.json"}}})
			},
			reason:    "SCHEMA_REMOTE_REF",
			condition: "SchemaRemoteRef",
			fields:    []string{"spec.inputSchema"},
		},
		{
			name: "refused-handle-not-in-schema",
			mutate: func(c *v1alpha1.Capability) {
				c.Spec.Handles = []v1alpha1.HandleField{{Field: "folder", RefersTo: "source"}}
			},
			reason:    "INVALID_HANDLES",
			condition: "InvalidHandles",
			fields:    []string{"spec.handles[0].field"},
		},
		{
			name: "refused-external-effect-without-idempotency",
			mutate: func(c *v1alpha1.Capability) {
				c.Spec.EffectClass, c.Spec.RetryRule, c.Spec.Approval = v1alpha1.EffectExternalEffect, v1alpha1.RetryNeverBlind, ""
			},
			reason:    "EXTERNAL_EFFECT_REQUIREMENTS",
			condition: "ExternalEffectRequirements",
			fields:    []string{"spec.idempotencyRequired"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newDefFixture(t)
			c := projectFileCapability(t, tt.name)
			tt.mutate(c)
			f.create(c)
			res, err := f.caps.Reconcile(f.ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: tt.name}})
			if err != nil || res.RequeueAfter != 0 {
				t.Errorf("reconcile = %+v, %v; want no error and no requeue: a refused spec waits for a new spec", res, err)
			}
			name := strings.ReplaceAll(tt.name, "-", "_")
			if _, err := registry.GetCapability(f.ctx, &registryv1.GetCapabilityRequest{Name: name}); status.Code(err) != codes.NotFound {
				t.Errorf("GetCapability after the refusal = %v; want NotFound (nothing stored)", err)
			}
			c = f.capability(tt.name)
			a := cond(c.Status.Conditions, v1alpha1.ConditionAccepted)
			if a.Status != metav1.ConditionFalse || a.Reason != tt.condition || !strings.Contains(a.Message, tt.reason) {
				t.Errorf("Accepted = %+v; want False/%s naming %s", a, tt.condition, tt.reason)
			}
			if r := cond(c.Status.Conditions, v1alpha1.ConditionReady); r.Status != metav1.ConditionFalse || r.Reason != v1alpha1.ReasonNotDeclared {
				t.Errorf("Ready = %+v; want False/NotDeclared", r)
			}
			ref := c.Status.Refusal
			if ref == nil || ref.Code != "InvalidArgument" || ref.Reason != tt.reason {
				t.Fatalf("refusal = %+v; want InvalidArgument %s", ref, tt.reason)
			}
			var fields []string
			for _, v := range ref.FieldViolations {
				fields = append(fields, v.Field)
				if v.Description == "" {
					t.Errorf("violation %s has no description", v.Field)
				}
			}
			if !slices.Equal(fields, tt.fields) {
				t.Errorf("field violations %v; want %v", fields, tt.fields)
			}
			if !f.events.has("Refused") {
				t.Errorf("events = %v; want Refused", f.events.events)
			}
			n := len(f.events.events)
			f.reconcileCap(tt.name)
			if len(f.events.events) != n {
				t.Errorf("reconciling the same refused spec again emitted %v; want no new event", f.events.events[n:])
			}

			fixed := projectFileCapability(t, tt.name)
			f.edit(c, func() { c.Spec = fixed.Spec })
			f.reconcileCap(tt.name)
			c = f.capability(tt.name)
			if a := cond(c.Status.Conditions, v1alpha1.ConditionAccepted); a.Status != metav1.ConditionTrue || c.Status.Refusal != nil || c.Status.Revision != 1 {
				t.Errorf("after the fix: Accepted %+v, refusal %+v, revision %d; want accepted at revision 1", a, c.Status.Refusal, c.Status.Revision)
			}
		})
	}
}

// A refused edit of an accepted Capability leaves the accepted revision in
// force, unchanged in the registry, and Ready says so.
func TestCapabilityRefusedEditKeepsRevisionInForce(t *testing.T) {
	t.Parallel()
	f := newDefFixture(t)
	c := projectFileCapability(t, "read-project-readme")
	f.create(c)
	f.reconcileCap("read-project-readme")
	before := f.registered("read_project_readme")
	f.edit(c, func() { c.Spec.SummaryTemplate = "Read {folder}" })
	f.reconcileCap("read-project-readme")

	c = f.capability("read-project-readme")
	if a := cond(c.Status.Conditions, v1alpha1.ConditionAccepted); a.Status != metav1.ConditionFalse || a.Reason != "InvalidSummaryTemplate" {
		t.Errorf("Accepted = %+v; want False/InvalidSummaryTemplate", a)
	}
	if r := cond(c.Status.Conditions, v1alpha1.ConditionReady); r.Status != metav1.ConditionTrue || !strings.Contains(r.Message, "revision 1") {
		t.Errorf("Ready = %+v; want True: revision 1 stays in force", r)
	}
	if c.Status.Revision != 1 || c.Status.AcceptedGeneration != 1 || c.Generation != 2 {
		t.Errorf("status revision %d from generation %d (generation %d); want revision 1 from generation 1", c.Status.Revision, c.Status.AcceptedGeneration, c.Generation)
	}
	if after := f.registered("read_project_readme"); after.GetRevision() != 1 || after.GetSummaryTemplate() != before.GetSummaryTemplate() {
		t.Errorf("registry after a refused edit = %v; want revision 1 unchanged", after)
	}
}

// Deleting a Capability deprecates its registry definition, which stays
// readable with every revision, and then lets the resource go.
func TestCapabilityDeletionDeprecates(t *testing.T) {
	t.Parallel()
	f := newDefFixture(t)
	c := projectFileCapability(t, "read-project-changelog")
	f.create(c)
	f.reconcileCap("read-project-changelog")
	f.delete(c)
	f.reconcileCap("read-project-changelog")

	f.gone(&v1alpha1.Capability{ObjectMeta: metav1.ObjectMeta{Name: "read-project-changelog"}})
	got := f.registered("read_project_changelog")
	if got.GetState() != registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED || got.GetRevision() != 1 ||
		!strings.Contains(got.GetDeprecationReason(), "capabilities.v0m3.dev read-project-changelog was deleted") {
		t.Errorf("registry after deletion = %v; want revision 1 deprecated, saying why", got)
	}
	list, err := registry.ListCapabilities(f.ctx, &registryv1.ListCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list.GetCapabilities() {
		if c.GetName() == "read_project_changelog" {
			t.Errorf("the deprecated capability is still listed as current")
		}
	}
	if !f.events.has("Deprecated") {
		t.Errorf("events = %v; want Deprecated", f.events.events)
	}

	// Applied again (GitOps re-creates it), the resource declares it again.
	f.create(projectFileCapability(t, "read-project-changelog"))
	f.reconcileCap("read-project-changelog")
	if got := f.registered("read_project_changelog"); got.GetState() != registryv1.DefinitionState_DEFINITION_STATE_ACTIVE || got.GetRevision() != 2 {
		t.Errorf("registry after re-creating the resource = %v; want revision 2, active", got)
	}
}

// A registry name someone else manages is not the resource's: it is
// refused with NameClaimed and the definition is left exactly as it was,
// and deleting the refused resource deprecates nothing (claiming a name
// and deleting the claim must not switch off another team's capability).
// The adopt annotation takes it over on purpose.
func TestCapabilityNameClaimed(t *testing.T) {
	t.Parallel()
	f := newDefFixture(t)
	theirs := &registryv1.Capability{
		Name:        "search_team_notes",
		EffectClass: registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL,
		InputSchema: func() *structpb.Struct {
			s, _ := structpb.NewStruct(map[string]any{"type": "object", "properties": map[string]any{"file": map[string]any{"type": "string"}}})
			return s
		}(),
		Description: "Search the team's notes.",
		RetryRule:   registryv1.RetryRule_RETRY_RULE_RETRY,
		ManagedBy:   "team-notes",
	}
	declared, err := services.Registry.CreateCapability(services.As(f.ctx, platformEngineer, "platform"), &registryv1.CreateCapabilityRequest{Capability: theirs})
	if err != nil {
		t.Fatalf("CreateCapability as a person: %v", err)
	}

	tests := []struct {
		resource, registryName, manager string
	}{
		{"search-team-notes", "search_team_notes", "team-notes"},
		// The shipped defaults are someone else's too.
		{"retrieve-authorized-source", "retrieve_authorized_source", "v0m3/defaults"},
	}
	for _, tt := range tests {
		before := f.registered(tt.registryName)
		c := projectFileCapability(t, tt.resource)
		f.create(c)
		if res := f.reconcileCap(tt.resource); res.RequeueAfter <= 0 {
			t.Errorf("%s: result %+v; want a resync to notice the name released", tt.resource, res)
		}
		c = f.capability(tt.resource)
		if a := cond(c.Status.Conditions, v1alpha1.ConditionAccepted); a.Status != metav1.ConditionFalse || a.Reason != v1alpha1.ReasonNameClaimed ||
			!strings.Contains(a.Message, tt.manager) || !strings.Contains(a.Message, v1alpha1.AnnotationAdopt) {
			t.Errorf("%s: Accepted = %+v; want False/NameClaimed naming %s and the adopt annotation", tt.resource, a, tt.manager)
		}
		if r := cond(c.Status.Conditions, v1alpha1.ConditionReady); r.Status != metav1.ConditionFalse || r.Reason != v1alpha1.ReasonNameClaimed {
			t.Errorf("%s: Ready = %+v; want False/NameClaimed", tt.resource, r)
		}
		if c.Status.Revision != 0 || c.Status.ManagedBy != tt.manager {
			t.Errorf("%s: status revision %d managed by %q; want 0 and the other manager", tt.resource, c.Status.Revision, c.Status.ManagedBy)
		}
		after := f.registered(tt.registryName)
		if after.GetRevision() != before.GetRevision() || after.GetManagedBy() != tt.manager || after.GetDescription() != before.GetDescription() {
			t.Errorf("%s: registry after the refused claim = %v; want it unchanged", tt.resource, after)
		}

		f.delete(c)
		f.reconcileCap(tt.resource)
		f.gone(&v1alpha1.Capability{ObjectMeta: metav1.ObjectMeta{Name: tt.resource}})
		if after := f.registered(tt.registryName); after.GetState() != registryv1.DefinitionState_DEFINITION_STATE_ACTIVE || after.GetRevision() != before.GetRevision() {
			t.Errorf("%s: registry after deleting the refused resource = %v; want it active and unchanged", tt.resource, after)
		}
	}
	if !f.events.has(v1alpha1.ReasonNameClaimed) || !f.events.has("LeftAsIs") || f.events.has("Deprecated") {
		t.Errorf("events = %v; want NameClaimed and LeftAsIs, no Deprecated", f.events.events)
	}

	// Adopting on purpose: the resource's contract becomes the next
	// revision, managed by the resource.
	c := projectFileCapability(t, "search-team-notes")
	c.Annotations = map[string]string{v1alpha1.AnnotationAdopt: "true"}
	f.create(c)
	f.reconcileCap("search-team-notes")
	got := f.registered("search_team_notes")
	if got.GetRevision() != declared.GetRevision()+1 || got.GetManagedBy() != "kubernetes/capabilities.v0m3.dev/search-team-notes" {
		t.Errorf("registry after adoption = %v; want the next revision, managed by the resource", got)
	}
	if a := cond(f.capability("search-team-notes").Status.Conditions, v1alpha1.ConditionAccepted); a.Status != metav1.ConditionTrue {
		t.Errorf("Accepted after adoption = %+v; want True", a)
	}
	if !f.events.has("Adopted") {
		t.Errorf("events = %v; want Adopted", f.events.events)
	}
}

// A person who deprecates a resource's capability in the registry is not
// overruled at the next resync; changing the spec declares it again.
func TestCapabilityDeprecatedOutsideKubernetes(t *testing.T) {
	t.Parallel()
	f := newDefFixture(t)
	c := projectFileCapability(t, "read-project-license")
	f.create(c)
	f.reconcileCap("read-project-license")
	if _, err := services.Registry.DeprecateCapability(services.As(f.ctx, platformEngineer, "platform"), &registryv1.DeprecateCapabilityRequest{
		Name: "read_project_license", Reason: "licences come from the legal index now"}); err != nil {
		t.Fatal(err)
	}
	f.reconcileCap("read-project-license")
	f.reconcileCap("read-project-license")
	if got := f.registered("read_project_license"); got.GetState() != registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED || got.GetRevision() != 1 {
		t.Errorf("registry after resyncs = %v; want still deprecated at revision 1", got)
	}
	c = f.capability("read-project-license")
	if r := cond(c.Status.Conditions, v1alpha1.ConditionReady); r.Status != metav1.ConditionFalse || r.Reason != v1alpha1.ReasonDeprecated ||
		!strings.Contains(r.Message, "legal index") {
		t.Errorf("Ready = %+v; want False/%s with the person's reason", r, v1alpha1.ReasonDeprecated)
	}
	if c.Status.State != "Deprecated" {
		t.Errorf("status state = %q; want Deprecated", c.Status.State)
	}

	f.edit(c, func() { c.Spec.RecoveryLimits = "none: a read" })
	f.reconcileCap("read-project-license")
	if got := f.registered("read_project_license"); got.GetState() != registryv1.DefinitionState_DEFINITION_STATE_ACTIVE || got.GetRevision() != 2 {
		t.Errorf("registry after a spec change = %v; want revision 2, active", got)
	}
	if r := cond(f.capability("read-project-license").Status.Conditions, v1alpha1.ConditionReady); r.Status != metav1.ConditionTrue {
		t.Errorf("Ready after the spec change = %+v; want True", r)
	}
}

// A TaskProfile is declared like a Capability and names the capabilities
// it needs. One that needs a capability not declared yet waits for it
// (Accepted=False, CapabilityUnknown, looked at again) instead of failing
// for good; once the capability is declared it is accepted. Editing it is
// a new revision, deleting it deprecates it.
func TestTaskProfileDeclared(t *testing.T) {
	t.Parallel()
	f := newDefFixture(t)
	p := &v1alpha1.TaskProfile{
		ObjectMeta: metav1.ObjectMeta{Name: "project-review"},
		Spec: v1alpha1.TaskProfileSpec{
			Description:   "Review a project's files and quote them.",
			Purpose:       "source_review",
			Needs:         []v1alpha1.ProfileNeed{{Capability: "read_project_spec", When: v1alpha1.NeedEvidenceAbsent}},
			DefaultBudget: &v1alpha1.TaskBudget{MaxCalls: 12, MaxResponseBytes: 1 << 20},
		},
	}
	f.create(p)
	res, err := f.profs.Reconcile(f.ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: "project-review"}})
	if err != nil || res.RequeueAfter <= 0 {
		t.Errorf("reconcile before the capability exists = %+v, %v; want no error and a requeue", res, err)
	}
	p = f.profile("project-review")
	if a := cond(p.Status.Conditions, v1alpha1.ConditionAccepted); a.Status != metav1.ConditionFalse || a.Reason != "CapabilityUnknown" ||
		!strings.Contains(a.Message, "read_project_spec") {
		t.Errorf("Accepted = %+v; want False/CapabilityUnknown naming the capability", a)
	}
	if _, err := registry.GetTaskProfile(f.ctx, &registryv1.GetTaskProfileRequest{Name: "project_review"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetTaskProfile = %v; want NotFound", err)
	}

	f.create(projectFileCapability(t, "read-project-spec"))
	f.reconcileCap("read-project-spec")
	f.reconcileProfile("project-review")
	got, err := registry.GetTaskProfile(f.ctx, &registryv1.GetTaskProfileRequest{Name: "project_review"})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetRevision() != 1 || got.GetPurpose() != "source_review" || got.GetManagedBy() != "kubernetes/taskprofiles.v0m3.dev/project-review" ||
		len(got.GetNeeds()) != 1 || got.GetNeeds()[0].GetCapability() != "read_project_spec" ||
		got.GetNeeds()[0].GetWhen() != registryv1.NeedCondition_NEED_CONDITION_EVIDENCE_ABSENT ||
		got.GetDefaultBudget().GetMaxCalls() != 12 || got.GetDefaultBudget().GetMaxResponseBytes() != 1<<20 {
		t.Errorf("registry holds %v; want the profile at revision 1 needing read_project_spec", got)
	}
	p = f.profile("project-review")
	if p.Status.Revision != 1 || p.Status.RegistryName != "project_review" || p.Status.Refusal != nil {
		t.Errorf("status = %+v; want revision 1", p.Status)
	}
	if a := cond(p.Status.Conditions, v1alpha1.ConditionAccepted); a.Status != metav1.ConditionTrue {
		t.Errorf("Accepted = %+v; want True", a)
	}
	rv := p.ResourceVersion
	f.reconcileProfile("project-review")
	if p = f.profile("project-review"); p.ResourceVersion != rv {
		t.Errorf("a settled reconcile wrote the TaskProfile")
	}

	f.edit(p, func() { p.Spec.DefaultBudget.MaxCalls = 20 })
	f.reconcileProfile("project-review")
	if got, err := registry.GetTaskProfile(f.ctx, &registryv1.GetTaskProfileRequest{Name: "project_review"}); err != nil ||
		got.GetRevision() != 2 || got.GetDefaultBudget().GetMaxCalls() != 20 {
		t.Errorf("registry after the edit = %v, %v; want revision 2 with 20 calls", got, err)
	}

	f.delete(p)
	f.reconcileProfile("project-review")
	f.gone(&v1alpha1.TaskProfile{ObjectMeta: metav1.ObjectMeta{Name: "project-review"}})
	if got, err := registry.GetTaskProfile(f.ctx, &registryv1.GetTaskProfileRequest{Name: "project_review"}); err != nil ||
		got.GetState() != registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED || got.GetRevision() != 2 {
		t.Errorf("registry after deletion = %v, %v; want revision 2 deprecated", got, err)
	}
}

// The API server itself refuses what cannot be a definition, with a
// message that says what to fix; the registry decides the rest.
func TestInvalidDefinitionManifestRefused(t *testing.T) {
	t.Parallel()
	f := newDefFixture(t)
	tests := []struct {
		name string
		obj  client.Object
		want string
	}{
		{"underscore in the name", func() client.Object {
			c := projectFileCapability(t, "read_project_file")
			return c
		}(), "metadata.name"},
		{"dots in the name", projectFileCapability(t, "read.project.file"), "lower-case words joined by single hyphens"},
		{"double hyphen", projectFileCapability(t, "read--file"), "lower-case words joined by single hyphens"},
		{"unknown effect class", func() client.Object {
			c := projectFileCapability(t, "bad-effect")
			c.Spec.EffectClass = "retrieval"
			return c
		}(), `supported values: "Retrieval", "LocalTransformation", "ExternalEffect"`},
		{"schema not an object", func() client.Object {
			c := projectFileCapability(t, "bad-schema")
			c.Spec.InputSchema = runtime.RawExtension{Raw: []byte(`"a string"`)}
			return c
		}(), "spec.inputSchema"},
		{"no retry rule", func() client.Object {
			c := projectFileCapability(t, "no-retry")
			c.Spec.RetryRule = ""
			return c
		}(), "spec.retryRule"},
		{"profile need with unknown condition", &v1alpha1.TaskProfile{
			ObjectMeta: metav1.ObjectMeta{Name: "bad-need"},
			Spec:       v1alpha1.TaskProfileSpec{Needs: []v1alpha1.ProfileNeed{{Capability: "read_project_file", When: "Sometimes"}}},
		}, "spec.needs[0].when"},
		{"negative budget", &v1alpha1.TaskProfile{
			ObjectMeta: metav1.ObjectMeta{Name: "bad-budget"},
			Spec:       v1alpha1.TaskProfileSpec{DefaultBudget: &v1alpha1.TaskBudget{MaxCalls: -1}},
		}, "spec.defaultBudget.maxCalls"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := k8s.Create(f.ctx, tt.obj)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("create = %v; want Invalid", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
		})
	}
}

// A name its manager deprecated is released: a resource waiting on it
// (refused with NameClaimed) declares it at its next resync.
func TestCapabilityClaimsReleasedName(t *testing.T) {
	t.Parallel()
	f := newDefFixture(t)
	as := services.As(f.ctx, platformEngineer, "platform")
	theirs := &registryv1.Capability{
		Name:        "search_team_wiki",
		EffectClass: registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL,
		InputSchema: func() *structpb.Struct {
			s, _ := structpb.NewStruct(map[string]any{"type": "object", "properties": map[string]any{"page": map[string]any{"type": "string"}}})
			return s
		}(),
		Description: "Search the team's wiki.",
		RetryRule:   registryv1.RetryRule_RETRY_RULE_RETRY,
		ManagedBy:   "team-wiki",
	}
	if _, err := services.Registry.CreateCapability(as, &registryv1.CreateCapabilityRequest{Capability: theirs}); err != nil {
		t.Fatal(err)
	}
	f.create(projectFileCapability(t, "search-team-wiki"))
	f.reconcileCap("search-team-wiki")
	if a := cond(f.capability("search-team-wiki").Status.Conditions, v1alpha1.ConditionAccepted); a.Reason != v1alpha1.ReasonNameClaimed {
		t.Fatalf("Accepted = %+v; want NameClaimed while team-wiki manages it", a)
	}
	if _, err := services.Registry.DeprecateCapability(as, &registryv1.DeprecateCapabilityRequest{
		Name: "search_team_wiki", Reason: "the platform team declares it in Kubernetes now"}); err != nil {
		t.Fatal(err)
	}
	f.reconcileCap("search-team-wiki")
	got := f.registered("search_team_wiki")
	if got.GetRevision() != 2 || got.GetState() != registryv1.DefinitionState_DEFINITION_STATE_ACTIVE ||
		got.GetManagedBy() != "kubernetes/capabilities.v0m3.dev/search-team-wiki" {
		t.Errorf("registry after the release = %v; want revision 2, active, managed by the resource", got)
	}
	c := f.capability("search-team-wiki")
	if a := cond(c.Status.Conditions, v1alpha1.ConditionAccepted); a.Status != metav1.ConditionTrue || c.Status.Revision != 2 {
		t.Errorf("Accepted = %+v, revision %d; want True at revision 2", a, c.Status.Revision)
	}
	if !f.events.has("Adopted") {
		t.Errorf("events = %v; want Adopted", f.events.events)
	}
}
