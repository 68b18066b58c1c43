package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// CapabilityResource is the Kubernetes resource of Capabilities, in the
// form managed_by names it.
const CapabilityResource = "capabilities.v0m3.dev"

// CapabilityReconciler declares Capability resources in the registry as
// the operator peer: create when absent, else update (the registry makes
// an identical contract a no-op, and compare-and-sets on the revision
// read), deprecate on deletion.
type CapabilityReconciler struct {
	Client   client.Client
	Registry registryv1.RegistryServiceClient
	Events   events.EventRecorder
	// Now returns the current time; nil uses time.Now.
	Now func() time.Time
}

// +kubebuilder:rbac:groups=v0m3.dev,resources=capabilities;taskprofiles,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=v0m3.dev,resources=capabilities/status;taskprofiles/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=v0m3.dev,resources=capabilities/finalizers;taskprofiles/finalizers,verbs=update

// SetupWithManager registers the reconciler. Only spec (generation) and
// annotation changes start a reconcile: the operator's own status writes
// do not, so a refused spec is not sent to the registry again and again.
// The resync picks up registry-side changes.
func (r *CapabilityReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.Capability{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Complete(r)
}

func (r *CapabilityReconciler) definitions() *definitions[*registryv1.Capability] {
	now := r.Now
	if now == nil {
		now = time.Now
	}
	reg := r.Registry
	return &definitions[*registryv1.Capability]{
		client: r.Client, events: r.Events, now: now,
		ops: definitionOps[*registryv1.Capability]{
			kind:     "capability",
			resource: CapabilityResource,
			get: func(ctx context.Context, name string) (*registryv1.Capability, error) {
				return reg.GetCapability(ctx, &registryv1.GetCapabilityRequest{Name: name})
			},
			create: func(ctx context.Context, want *registryv1.Capability) (*registryv1.Capability, error) {
				return reg.CreateCapability(ctx, &registryv1.CreateCapabilityRequest{Capability: want})
			},
			update: func(ctx context.Context, want *registryv1.Capability, expected int64) (*registryv1.Capability, error) {
				return reg.UpdateCapability(ctx, &registryv1.UpdateCapabilityRequest{Capability: want, ExpectedRevision: expected})
			},
			deprecate: func(ctx context.Context, name, reason string) (*registryv1.Capability, error) {
				return reg.DeprecateCapability(ctx, &registryv1.DeprecateCapabilityRequest{Name: name, Reason: reason})
			},
		},
	}
}

// Reconcile declares one Capability in the registry and records the
// revision, the verdict and the mappings waiting for review.
func (r *CapabilityReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var c v1alpha1.Capability
	if err := r.Client.Get(ctx, req.NamespacedName, &c); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	d := r.definitions()
	if !c.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, d.finalize(ctx, &c)
	}
	if err := d.addFinalizer(ctx, &c); err != nil {
		return reconcile.Result{}, err
	}

	before := c.Status.DeepCopy()
	want, specErr := capabilityContract(&c)
	got, res, err := d.declare(ctx, &c, &c.Status.DefinitionStatus, want, specErr)
	if got != nil {
		c.Status.InputSchemaDigest = got.GetInputSchemaDigest()
		r.observeMappings(ctx, d, &c)
	} else if c.Status.ManagedBy != managedBy(CapabilityResource, c.Name) {
		// Not this resource's definition: its mappings are not its concern.
		c.Status.InputSchemaDigest, c.Status.MappingsNeedingReview = "", 0
		meta.RemoveStatusCondition(&c.Status.Conditions, v1alpha1.ConditionReviewRequired)
	}
	c.Status.ObservedGeneration = c.Generation
	if !equality.Semantic.DeepEqual(before, &c.Status) {
		if uerr := r.Client.Status().Update(ctx, &c); uerr != nil {
			return reconcile.Result{}, errors.Join(err, fmt.Errorf("update status: %w", uerr))
		}
	}
	return res, err
}

// observeMappings counts the capability's mappings that wait for a
// person's review. A failure leaves ReviewRequired Unknown rather than
// failing the reconcile: the definition itself is recorded.
func (r *CapabilityReconciler) observeMappings(ctx context.Context, d *definitions[*registryv1.Capability], c *v1alpha1.Capability) {
	st := &c.Status.DefinitionStatus
	list, err := r.Registry.ListMappings(ctx, &registryv1.ListMappingsRequest{Capability: c.Status.RegistryName, PageSize: maxPageSize})
	if err != nil {
		d.setCondition(c, st, v1alpha1.ConditionReviewRequired, metav1.ConditionUnknown, v1alpha1.ReasonRegistryUnavailable,
			"could not list the capability's mappings: "+status.Convert(err).Message())
		return
	}
	var waiting []string
	for _, m := range list.GetMappings() {
		switch m.GetState() {
		case registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED, registryv1.MappingState_MAPPING_STATE_PENDING_REVIEW:
			waiting = append(waiting, m.GetId())
		}
	}
	c.Status.MappingsNeedingReview = int32(len(waiting))
	if len(waiting) == 0 {
		d.setCondition(c, st, v1alpha1.ConditionReviewRequired, metav1.ConditionFalse, v1alpha1.ReasonNothingToReview,
			"no mapping of the capability waits for review")
		return
	}
	msg := fmt.Sprintf("%d mapping(s) of capability %s wait for a person's review in the registry against revision %d: %s",
		len(waiting), c.Status.RegistryName, c.Status.Revision, strings.Join(waiting, ", "))
	if d.transition(c, st, v1alpha1.ConditionReviewRequired, metav1.ConditionTrue, v1alpha1.ReasonMappingsNeedReview, msg) {
		d.event(c, corev1.EventTypeNormal, v1alpha1.ReasonMappingsNeedReview, "ObserveMappings", msg)
	}
}

// Enum spellings of the CRD and the registry.
var (
	effectClasses = map[string]registryv1.EffectClass{
		v1alpha1.EffectRetrieval:           registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL,
		v1alpha1.EffectLocalTransformation: registryv1.EffectClass_EFFECT_CLASS_LOCAL_TRANSFORMATION,
		v1alpha1.EffectExternalEffect:      registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT,
	}
	retryRules = map[string]registryv1.RetryRule{
		v1alpha1.RetryRetry:        registryv1.RetryRule_RETRY_RULE_RETRY,
		v1alpha1.RetryCheckReceipt: registryv1.RetryRule_RETRY_RULE_CHECK_RECEIPT,
		v1alpha1.RetryNeverBlind:   registryv1.RetryRule_RETRY_RULE_NEVER_BLIND,
	}
	resultKinds = map[string]registryv1.ResultKind{
		v1alpha1.ResultSourceObservation: registryv1.ResultKind_RESULT_KIND_SOURCE_OBSERVATION,
		v1alpha1.ResultArtifact:          registryv1.ResultKind_RESULT_KIND_ARTIFACT,
		v1alpha1.ResultReceipt:           registryv1.ResultKind_RESULT_KIND_RECEIPT,
		v1alpha1.ResultData:              registryv1.ResultKind_RESULT_KIND_DATA,
	}
	handleKinds = map[string]registryv1.HandleKind{
		v1alpha1.HandleSource:      registryv1.HandleKind_HANDLE_KIND_SOURCE,
		v1alpha1.HandleArtifact:    registryv1.HandleKind_HANDLE_KIND_ARTIFACT,
		v1alpha1.HandleDestination: registryv1.HandleKind_HANDLE_KIND_DESTINATION,
	}
	approvals = map[string]registryv1.ApprovalRequirement{
		v1alpha1.ApprovalPolicy: registryv1.ApprovalRequirement_APPROVAL_REQUIREMENT_POLICY,
		v1alpha1.ApprovalAlways: registryv1.ApprovalRequirement_APPROVAL_REQUIREMENT_ALWAYS,
	}
)

// capabilityContract is the registry contract a Capability declares. The
// CRD's enums guarantee known spellings; an empty optional enum is the
// registry's "unspecified". It fails only when the input schema is not a
// JSON object, which the CRD's type already prevents.
func capabilityContract(c *v1alpha1.Capability) (*registryv1.Capability, error) {
	s := c.Spec
	schema, err := jsonObject(s.InputSchema.Raw)
	if err != nil {
		return nil, fmt.Errorf("spec.inputSchema: %w", err)
	}
	out := &registryv1.Capability{
		Name:                registryName(c.Name),
		EffectClass:         effectClasses[s.EffectClass],
		InputSchema:         schema,
		Description:         s.Description,
		Preconditions:       s.Preconditions,
		ResultState:         s.ResultState,
		Authority:           s.Authority,
		Evidence:            s.Evidence,
		RetryRule:           retryRules[s.RetryRule],
		RecoveryLimits:      s.RecoveryLimits,
		ResultKind:          resultKinds[s.ResultKind],
		IdempotencyRequired: s.IdempotencyRequired,
		Approval:            approvals[s.Approval],
		SummaryTemplate:     s.SummaryTemplate,
		ManagedBy:           managedBy(CapabilityResource, c.Name),
	}
	for _, h := range s.Handles {
		out.Handles = append(out.Handles, &registryv1.HandleField{Field: h.Field, RefersTo: h.RefersTo, Kind: handleKinds[h.Kind]})
	}
	if l := s.DefaultLimits; l != nil {
		out.DefaultLimits = &registryv1.Limits{
			MaxResponseBytes:      l.MaxResponseBytes,
			MaxItems:              l.MaxItems,
			AllowedMediaTypes:     l.AllowedMediaTypes,
			AssetReferenceAllowed: l.AssetReferenceAllowed,
		}
	}
	return out, nil
}

// jsonObject decodes raw JSON that must be an object.
func jsonObject(raw []byte) (*structpb.Struct, error) {
	if len(raw) == 0 {
		return nil, errors.New("a JSON Schema object is required")
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil, fmt.Errorf("not representable as JSON: %w", err)
	}
	return s, nil
}
