package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TaskProfileResource is the Kubernetes resource of TaskProfiles, in the
// form managed_by names it.
const TaskProfileResource = "taskprofiles.v0m3.dev"

// needsIndex indexes TaskProfiles by the registry names of the
// capabilities they need.
const needsIndex = ".spec.needs.capability"

// TaskProfileReconciler declares TaskProfile resources in the registry as
// the operator peer, like CapabilityReconciler does capabilities.
type TaskProfileReconciler struct {
	Client   client.Client
	Registry registryv1.RegistryServiceClient
	Events   events.EventRecorder
	// Now returns the current time; nil uses time.Now.
	Now func() time.Time
}

// SetupWithManager registers the reconciler. Besides its own spec and
// annotation changes, a Capability's status change (its revision
// recorded) wakes the profiles that need it: applied together, a profile
// whose capability was not declared yet is declared as soon as the
// capability is, not at the next resync.
func (r *TaskProfileReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.TaskProfile{}, needsIndex, func(o client.Object) []string {
		var out []string
		for _, n := range o.(*v1alpha1.TaskProfile).Spec.Needs {
			out = append(out, n.Capability)
		}
		return out
	}); err != nil {
		return fmt.Errorf("index TaskProfiles by needed capability: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.TaskProfile{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Watches(&v1alpha1.Capability{}, handler.EnqueueRequestsFromMapFunc(r.profilesNeeding)).
		Complete(r)
}

// profilesNeeding maps a Capability to the TaskProfiles that need it.
func (r *TaskProfileReconciler) profilesNeeding(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.TaskProfileList
	if err := r.Client.List(ctx, &list, client.MatchingFields{needsIndex: registryName(o.GetName())}); err != nil {
		log.FromContext(ctx).Error(err, "list TaskProfiles needing Capability", "capability", o.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, p := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
	}
	return reqs
}

func (r *TaskProfileReconciler) definitions() *definitions[*registryv1.TaskProfile] {
	now := r.Now
	if now == nil {
		now = time.Now
	}
	reg := r.Registry
	return &definitions[*registryv1.TaskProfile]{
		client: r.Client, events: r.Events, now: now,
		ops: definitionOps[*registryv1.TaskProfile]{
			kind:     "task profile",
			resource: TaskProfileResource,
			get: func(ctx context.Context, name string) (*registryv1.TaskProfile, error) {
				return reg.GetTaskProfile(ctx, &registryv1.GetTaskProfileRequest{Name: name})
			},
			create: func(ctx context.Context, want *registryv1.TaskProfile) (*registryv1.TaskProfile, error) {
				return reg.CreateTaskProfile(ctx, &registryv1.CreateTaskProfileRequest{Profile: want})
			},
			update: func(ctx context.Context, want *registryv1.TaskProfile, expected int64) (*registryv1.TaskProfile, error) {
				return reg.UpdateTaskProfile(ctx, &registryv1.UpdateTaskProfileRequest{Profile: want, ExpectedRevision: expected})
			},
			deprecate: func(ctx context.Context, name, reason string) (*registryv1.TaskProfile, error) {
				return reg.DeprecateTaskProfile(ctx, &registryv1.DeprecateTaskProfileRequest{Name: name, Reason: reason})
			},
		},
	}
}

// Reconcile declares one TaskProfile in the registry and records the
// revision and the verdict.
func (r *TaskProfileReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var p v1alpha1.TaskProfile
	if err := r.Client.Get(ctx, req.NamespacedName, &p); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	d := r.definitions()
	if !p.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, d.finalize(ctx, &p)
	}
	if err := d.addFinalizer(ctx, &p); err != nil {
		return reconcile.Result{}, err
	}
	before := p.Status.DeepCopy()
	_, res, err := d.declare(ctx, &p, &p.Status.DefinitionStatus, taskProfileDefinition(&p), nil)
	p.Status.ObservedGeneration = p.Generation
	if !equality.Semantic.DeepEqual(before, &p.Status) {
		if uerr := r.Client.Status().Update(ctx, &p); uerr != nil {
			return reconcile.Result{}, errors.Join(err, fmt.Errorf("update status: %w", uerr))
		}
	}
	return res, err
}

var needConditions = map[string]registryv1.NeedCondition{
	v1alpha1.NeedAlways:          registryv1.NeedCondition_NEED_CONDITION_ALWAYS,
	v1alpha1.NeedEvidenceAbsent:  registryv1.NeedCondition_NEED_CONDITION_EVIDENCE_ABSENT,
	v1alpha1.NeedEvidencePresent: registryv1.NeedCondition_NEED_CONDITION_EVIDENCE_PRESENT,
}

// taskProfileDefinition is the registry profile a TaskProfile declares.
func taskProfileDefinition(p *v1alpha1.TaskProfile) *registryv1.TaskProfile {
	out := &registryv1.TaskProfile{
		Name:        registryName(p.Name),
		Description: p.Spec.Description,
		Purpose:     p.Spec.Purpose,
		ManagedBy:   managedBy(TaskProfileResource, p.Name),
	}
	for _, n := range p.Spec.Needs {
		out.Needs = append(out.Needs, &registryv1.ProfileNeed{Capability: n.Capability, When: needConditions[n.When]})
	}
	if b := p.Spec.DefaultBudget; b != nil {
		out.DefaultBudget = &registryv1.TaskBudget{MaxCalls: b.MaxCalls, MaxResponseBytes: b.MaxResponseBytes, MaxCostMicros: b.MaxCostMicros}
	}
	return out
}
