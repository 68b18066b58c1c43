package controller

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// DefinitionFinalizer deprecates a Capability's or TaskProfile's registry
// definition before the resource goes away. Deprecated definitions stay
// readable, with every revision and every record that refers to them.
const DefinitionFinalizer = "v0m3.dev/deprecate-definition"

// This file holds what the Capability and TaskProfile reconcilers share:
// how a resource names and claims its registry definition, how the
// registry's answers become conditions, and how deletion deprecates. The
// registry is the one place that validates a definition; the operator only
// carries the spec there and its verdict back.

// definition is what the registry's Capability and TaskProfile share.
type definition interface {
	proto.Message
	GetName() string
	GetRevision() int64
	GetState() registryv1.DefinitionState
	GetManagedBy() string
	GetDeprecationReason() string
}

// definitionOps are one kind's registry calls.
type definitionOps[M definition] struct {
	// kind names the registry resource in messages: "capability".
	kind string
	// resource is the Kubernetes resource, plural.group.
	resource  string
	get       func(ctx context.Context, name string) (M, error)
	create    func(ctx context.Context, want M) (M, error)
	update    func(ctx context.Context, want M, expected int64) (M, error)
	deprecate func(ctx context.Context, name, reason string) (M, error)
}

// definitions declares resources of one kind in the registry.
type definitions[M definition] struct {
	client client.Client
	events events.EventRecorder
	now    func() time.Time
	ops    definitionOps[M]
}

// registryName is the registry name a resource declares: its Kubernetes
// name with hyphens written as underscores. Kubernetes names cannot hold
// underscores and registry names cannot hold hyphens, so the mapping is
// one to one: two resources of a kind never claim one registry name.
func registryName(resourceName string) string {
	return strings.ReplaceAll(resourceName, "-", "_")
}

// managedBy is the registry's managed_by of the definition a resource
// declares, in kubectl's resource/name form, so a person reading the
// registry finds the resource with `kubectl get <managed_by minus
// kubernetes/>`. The resources are cluster-scoped: no namespace.
func managedBy(resource, resourceName string) string {
	return "kubernetes/" + resource + "/" + resourceName
}

// declare makes the registry hold want as the current revision of the
// definition obj declares, records what happened in st and returns the
// definition as the registry holds it (nil-valued when there is none this
// resource manages). specErr, when set, means the spec could not be turned
// into a registry definition at all.
func (d *definitions[M]) declare(ctx context.Context, obj client.Object, st *v1alpha1.DefinitionStatus, want M, specErr error) (M, reconcile.Result, error) {
	var none M
	name := registryName(obj.GetName())
	ours := managedBy(d.ops.resource, obj.GetName())
	st.RegistryName = name
	if specErr != nil {
		d.refuse(obj, st, v1alpha1.ReasonInvalidSpec, &v1alpha1.RegistryRefusal{Code: codes.InvalidArgument.String(), Message: specErr.Error()})
		return none, reconcile.Result{}, nil
	}

	cur, err := d.ops.get(ctx, name)
	if status.Code(err) == codes.NotFound {
		created, err := d.ops.create(ctx, want)
		if err != nil {
			res, err := d.failed(obj, st, "create", err)
			return none, res, err
		}
		d.event(obj, corev1.EventTypeNormal, "Declared", "Create"+d.action(),
			fmt.Sprintf("%s %s declared in the registry at revision %d", d.ops.kind, name, created.GetRevision()))
		d.accepted(obj, st, created)
		return created, reconcile.Result{RequeueAfter: resyncPeriod}, nil
	}
	if err != nil {
		res, err := d.failed(obj, st, "read", err)
		return none, res, err
	}

	adopting := false
	deprecated := cur.GetState() == registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED
	switch {
	case cur.GetManagedBy() != ours && !deprecated && obj.GetAnnotations()[v1alpha1.AnnotationAdopt] != "true":
		// Someone else declares this name. Changing their definition
		// behind their back would send their mappings to review and
		// change what their tasks are offered: refuse and change nothing.
		d.claimed(obj, st, cur)
		return none, reconcile.Result{RequeueAfter: resyncPeriod}, nil
	case cur.GetManagedBy() != ours:
		// A deprecated definition was let go; the adopt annotation takes
		// over an active one on purpose.
		adopting = true
	case deprecated && st.AcceptedGeneration == obj.GetGeneration() && st.Revision == cur.GetRevision():
		// Deprecated in the registry outside Kubernetes after this very
		// spec was accepted: a person decided so. Declaring it again on
		// the next resync would undo that decision with a new revision;
		// a new spec does, deliberately.
		d.deprecatedOutside(obj, st, cur)
		return cur, reconcile.Result{RequeueAfter: resyncPeriod}, nil
	}

	got, err := d.ops.update(ctx, want, cur.GetRevision())
	if err != nil {
		res, err := d.failed(obj, st, "update", err)
		return none, res, err
	}
	switch {
	case adopting:
		d.event(obj, corev1.EventTypeNormal, "Adopted", "Update"+d.action(),
			fmt.Sprintf("took over %s %s from %q at revision %d (now revision %d)", d.ops.kind, name, cur.GetManagedBy(), cur.GetRevision(), got.GetRevision()))
	case got.GetRevision() != cur.GetRevision():
		d.event(obj, corev1.EventTypeNormal, "Revised", "Update"+d.action(),
			fmt.Sprintf("%s %s revised from revision %d to %d", d.ops.kind, name, cur.GetRevision(), got.GetRevision()))
	}
	d.accepted(obj, st, got)
	return got, reconcile.Result{RequeueAfter: resyncPeriod}, nil
}

// action is the event action suffix: "Capability", "TaskProfile".
func (d *definitions[M]) action() string {
	if d.ops.kind == "capability" {
		return "Capability"
	}
	return "TaskProfile"
}

// accepted records that got, managed by obj, is the registry's current
// revision of the definition obj declares at its current generation.
func (d *definitions[M]) accepted(obj client.Object, st *v1alpha1.DefinitionStatus, got M) {
	st.Revision = got.GetRevision()
	st.AcceptedGeneration = obj.GetGeneration()
	st.State = stateWord(got.GetState())
	st.ManagedBy = got.GetManagedBy()
	st.Refusal = nil
	d.setCondition(obj, st, v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonRevisionRecorded,
		fmt.Sprintf("the registry holds generation %d as revision %d of %s %s", obj.GetGeneration(), got.GetRevision(), d.ops.kind, got.GetName()))
	d.setCondition(obj, st, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonInForce,
		fmt.Sprintf("revision %d of %s %s is in force", got.GetRevision(), d.ops.kind, got.GetName()))
}

// claimed records that the definition obj declares is someone else's.
func (d *definitions[M]) claimed(obj client.Object, st *v1alpha1.DefinitionStatus, cur M) {
	st.Revision, st.AcceptedGeneration, st.Refusal = 0, 0, nil
	st.State, st.ManagedBy = stateWord(cur.GetState()), cur.GetManagedBy()
	manager := cur.GetManagedBy()
	if manager == "" {
		manager = "nobody named (declared through the registry's API)"
	} else {
		manager = fmt.Sprintf("%q", manager)
	}
	msg := fmt.Sprintf("the registry's %s %s (revision %d) is managed by %s, not by this resource; nothing was changed. Deprecate it there to release the name, or annotate this resource %s=true to take it over",
		d.ops.kind, cur.GetName(), cur.GetRevision(), manager, v1alpha1.AnnotationAdopt)
	if d.transition(obj, st, v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonNameClaimed, msg) {
		d.event(obj, corev1.EventTypeWarning, v1alpha1.ReasonNameClaimed, "Claim"+d.action(), msg)
	}
	d.setCondition(obj, st, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonNameClaimed,
		fmt.Sprintf("%s %s is not this resource's to declare", d.ops.kind, cur.GetName()))
}

// deprecatedOutside records that a person deprecated the definition in the
// registry after it was declared from this spec.
func (d *definitions[M]) deprecatedOutside(obj client.Object, st *v1alpha1.DefinitionStatus, cur M) {
	st.State, st.ManagedBy = stateWord(cur.GetState()), cur.GetManagedBy()
	msg := fmt.Sprintf("%s %s revision %d was deprecated in the registry outside Kubernetes (%s); change the spec to declare it again, or delete this resource",
		d.ops.kind, cur.GetName(), cur.GetRevision(), cur.GetDeprecationReason())
	if d.transition(obj, st, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonDeprecated, msg) {
		d.event(obj, corev1.EventTypeWarning, v1alpha1.ReasonDeprecated, "Observe"+d.action(), msg)
	}
}

// failed turns a registry error into conditions and says whether to retry.
// A refusal of the spec is terminal: nothing changes until the spec does.
// A refusal that depends on registry state (a capability not declared yet,
// a policy decision) is looked at again at the resync. Anything else (the
// registry unreachable, a concurrent change) returns the error so the
// controller's rate limiter retries with backoff.
func (d *definitions[M]) failed(obj client.Object, st *v1alpha1.DefinitionStatus, what string, err error) (reconcile.Result, error) {
	code := status.Code(err)
	switch code {
	case codes.InvalidArgument, codes.OutOfRange:
		d.refuse(obj, st, "", refusalOf(err))
		return reconcile.Result{}, nil
	case codes.NotFound, codes.FailedPrecondition, codes.PermissionDenied:
		d.refuse(obj, st, "", refusalOf(err))
		return reconcile.Result{RequeueAfter: resyncPeriod}, nil
	}
	reason := v1alpha1.ReasonRegistryUnavailable
	if code == codes.Aborted || code == codes.AlreadyExists {
		// Someone changed the definition between the read and the write:
		// the retry reads it again (and sees who manages it now).
		reason = v1alpha1.ReasonConcurrentChange
	}
	msg := fmt.Sprintf("could not %s %s %s in the registry (%s): %s; retrying with backoff",
		what, d.ops.kind, registryName(obj.GetName()), code, status.Convert(err).Message())
	if st.AcceptedGeneration != obj.GetGeneration() {
		d.setCondition(obj, st, v1alpha1.ConditionAccepted, metav1.ConditionUnknown, reason, msg)
	}
	if d.transition(obj, st, v1alpha1.ConditionReady, metav1.ConditionUnknown, reason, msg) {
		d.event(obj, corev1.EventTypeWarning, reason, strings.ToUpper(what[:1])+what[1:]+d.action(), msg)
	}
	return reconcile.Result{}, fmt.Errorf("%s %s %s: %w", what, d.ops.kind, registryName(obj.GetName()), err)
}

// refuse records that the current spec was refused. reason, when empty, is
// the registry's ErrorInfo reason in CamelCase. Whatever revision this
// resource declared before stays in force, and Ready says so.
func (d *definitions[M]) refuse(obj client.Object, st *v1alpha1.DefinitionStatus, reason string, r *v1alpha1.RegistryRefusal) {
	if reason == "" {
		reason = conditionReason(r.Reason)
	}
	st.Refusal = r
	msg := fmt.Sprintf("the registry refused generation %d: %s", obj.GetGeneration(), refusalText(r))
	if d.transition(obj, st, v1alpha1.ConditionAccepted, metav1.ConditionFalse, reason, msg) {
		d.event(obj, corev1.EventTypeWarning, "Refused", "Declare"+d.action(), msg)
	}
	if st.Revision > 0 && st.State == stateWord(registryv1.DefinitionState_DEFINITION_STATE_ACTIVE) {
		d.setCondition(obj, st, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonInForce,
			fmt.Sprintf("revision %d (generation %d) stays in force; the current spec was refused", st.Revision, st.AcceptedGeneration))
	} else {
		d.setCondition(obj, st, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonNotDeclared,
			fmt.Sprintf("the registry holds no %s of this resource", d.ops.kind))
	}
}

// finalize deprecates the definition obj declares, when obj manages it,
// then removes the finalizer. A definition someone else manages (the
// resource was refused, or someone took it over) is left as it is:
// deleting a resource never deprecates another's definition.
func (d *definitions[M]) finalize(ctx context.Context, obj client.Object) error {
	if !controllerutil.ContainsFinalizer(obj, DefinitionFinalizer) {
		return nil
	}
	name := registryName(obj.GetName())
	ours := managedBy(d.ops.resource, obj.GetName())
	cur, err := d.ops.get(ctx, name)
	switch {
	case status.Code(err) == codes.NotFound:
	case err != nil:
		d.event(obj, corev1.EventTypeWarning, v1alpha1.ReasonRegistryUnavailable, "Deprecate"+d.action(),
			fmt.Sprintf("could not read %s %s to deprecate it: %s", d.ops.kind, name, status.Convert(err).Message()))
		return fmt.Errorf("read %s %s: %w", d.ops.kind, name, err)
	case cur.GetManagedBy() != ours:
		d.event(obj, corev1.EventTypeNormal, "LeftAsIs", "Deprecate"+d.action(),
			fmt.Sprintf("%s %s is managed by %q, not this resource; left as it is", d.ops.kind, name, cur.GetManagedBy()))
	case cur.GetState() == registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED:
	default:
		reason := fmt.Sprintf("%s %s was deleted from Kubernetes", d.ops.resource, obj.GetName())
		if _, err := d.ops.deprecate(ctx, name, reason); err != nil {
			d.event(obj, corev1.EventTypeWarning, v1alpha1.ReasonRegistryUnavailable, "Deprecate"+d.action(),
				fmt.Sprintf("could not deprecate %s %s: %s", d.ops.kind, name, status.Convert(err).Message()))
			return fmt.Errorf("deprecate %s %s: %w", d.ops.kind, name, err)
		}
		d.event(obj, corev1.EventTypeNormal, "Deprecated", "Deprecate"+d.action(),
			fmt.Sprintf("%s %s revision %d deprecated; its revisions and every record that refers to it stay readable", d.ops.kind, name, cur.GetRevision()))
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	controllerutil.RemoveFinalizer(obj, DefinitionFinalizer)
	if err := d.client.Patch(ctx, obj, patch); err != nil {
		return fmt.Errorf("remove finalizer: %w", client.IgnoreNotFound(err))
	}
	return nil
}

// addFinalizer makes sure deletion waits for the deprecation.
func (d *definitions[M]) addFinalizer(ctx context.Context, obj client.Object) error {
	if controllerutil.AddFinalizer(obj, DefinitionFinalizer) {
		if err := d.client.Update(ctx, obj); err != nil {
			return fmt.Errorf("add finalizer: %w", err)
		}
	}
	return nil
}

func (d *definitions[M]) setCondition(obj client.Object, st *v1alpha1.DefinitionStatus, typ string, s metav1.ConditionStatus, reason, msg string) {
	setCondition(&st.Conditions, obj.GetGeneration(), typ, s, reason, msg, d.now())
}

// transition sets a condition and reports whether its reason or message
// changed, so an event is emitted once per change, not once per resync.
func (d *definitions[M]) transition(obj client.Object, st *v1alpha1.DefinitionStatus, typ string, s metav1.ConditionStatus, reason, msg string) bool {
	old := meta.FindStatusCondition(st.Conditions, typ)
	changed := old == nil || old.Status != s || old.Reason != reason || old.Message != msg
	d.setCondition(obj, st, typ, s, reason, msg)
	return changed
}

func (d *definitions[M]) event(obj client.Object, typ, reason, action, note string) {
	if d.events != nil {
		d.events.Eventf(obj, nil, typ, reason, action, "%s", note)
	}
}

// refusalOf reads a registry error: its code, ErrorInfo reason, message
// and field violations, with registry fields written as spec paths.
func refusalOf(err error) *v1alpha1.RegistryRefusal {
	st := status.Convert(err)
	r := &v1alpha1.RegistryRefusal{Code: st.Code().String(), Message: st.Message()}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			r.Reason = d.GetReason()
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				r.FieldViolations = append(r.FieldViolations, v1alpha1.FieldViolation{Field: specPath(v.GetField()), Description: v.GetDescription()})
			}
		}
	}
	return r
}

// refusalText is a refusal in one line: reason, message.
func refusalText(r *v1alpha1.RegistryRefusal) string {
	if r.Reason == "" {
		return fmt.Sprintf("%s: %s", r.Code, r.Message)
	}
	return fmt.Sprintf("%s (%s): %s", r.Reason, r.Code, r.Message)
}

// specPath writes a registry request field as the resource's spec path:
// capability.handles[0].refers_to is spec.handles[0].refersTo, and the
// definition's name is the resource's metadata.name. The CRD's fields are
// the proto's in camelCase, so the mapping is mechanical; a field outside
// the definition is returned as it is.
func specPath(field string) string {
	rest, ok := strings.CutPrefix(field, "capability.")
	if !ok {
		if rest, ok = strings.CutPrefix(field, "profile."); !ok {
			return field
		}
	}
	if rest == "name" {
		return "metadata.name"
	}
	parts := strings.Split(rest, ".")
	for i, p := range parts {
		parts[i] = lowerCamel(p)
	}
	return "spec." + strings.Join(parts, ".")
}

// lowerCamel writes snake_case as lowerCamel, leaving an index suffix
// such as [0] as it is.
func lowerCamel(s string) string {
	words := strings.Split(s, "_")
	for i := 1; i < len(words); i++ {
		if words[i] != "" {
			words[i] = strings.ToUpper(words[i][:1]) + words[i][1:]
		}
	}
	return strings.Join(words, "")
}

// reasonPattern is what metav1.Condition accepts as a reason.
var reasonPattern = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// conditionReason writes a registry ErrorInfo reason (INVALID_SCHEMA) as a
// condition reason (InvalidSchema).
func conditionReason(reason string) string {
	var b strings.Builder
	for _, w := range strings.Split(strings.ToLower(reason), "_") {
		if w != "" {
			b.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
	}
	if out := b.String(); reasonPattern.MatchString(out) {
		return out
	}
	return v1alpha1.ReasonRegistryRefused
}

// stateWord is a registry DefinitionState as the status shows it.
func stateWord(s registryv1.DefinitionState) string {
	switch s {
	case registryv1.DefinitionState_DEFINITION_STATE_ACTIVE:
		return "Active"
	case registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED:
		return "Deprecated"
	}
	return ""
}
