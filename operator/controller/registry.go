package controller

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// endpoint is the in-cluster URL of s's MCP endpoint, as the adapter reaches
// it through the Service.
func (r *Reconciler) endpoint(s *v1alpha1.MCPServer) string {
	if r.Options.Endpoint != nil {
		return r.Options.Endpoint(s)
	}
	return fmt.Sprintf("http://%s.%s.svc.%s:%d%s", s.Name, s.Namespace, r.Options.ClusterDomain, port(s), path(s))
}

// displayName is the registry display name of s.
func displayName(s *v1alpha1.MCPServer) string {
	if s.Spec.DisplayName != "" {
		return s.Spec.DisplayName
	}
	return s.Namespace + "/" + s.Name
}

// desiredConnection is the configuration s asks the registry to hold.
type desiredConnection struct {
	url, imageDigest, scope, credentialVersion, workloadDigest string
}

func (d desiredConnection) matches(c *registryv1.Connection) bool {
	return c.GetTransport().GetStreamableHttp().GetUrl() == d.url &&
		c.GetImageDigest() == d.imageDigest &&
		c.GetCredentialScope() == d.scope &&
		c.GetCredentialVersion() == d.credentialVersion &&
		c.GetWorkloadDigest() == d.workloadDigest
}

// register creates or updates s's registry connection so its current
// config revision matches the spec, image digest and credential version.
// It returns nil and no error when the connection cannot be used and
// retrying would not help (it was retired behind the operator's back).
//
// credential_ref stays empty: the credential lives in the server's pod, and
// the adapter must not resolve one for this endpoint.
func (r *Reconciler) register(ctx context.Context, s *v1alpha1.MCPServer, shape, credVersion string) (*registryv1.Connection, error) {
	want := desiredConnection{
		url:               r.endpoint(s),
		workloadDigest:    shape,
		imageDigest:       imageDigest(s.Spec.Image),
		credentialVersion: credVersion,
	}
	if s.Spec.Credentials != nil {
		want.scope = s.Spec.Credentials.Scope
	}
	transport := &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{
		StreamableHttp: &registryv1.StreamableHTTPTransport{Url: want.url}}}

	conn, err := r.currentConnection(ctx, s)
	if err != nil {
		return nil, r.registryFailed(s, "find the registry connection", err)
	}
	if conn == nil {
		conn, err = r.Registry.CreateConnection(ctx, &registryv1.CreateConnectionRequest{
			DisplayName:       displayName(s),
			Owner:             s.Spec.Owner,
			Transport:         transport,
			ImageDigest:       want.imageDigest,
			CredentialScope:   want.scope,
			CredentialVersion: want.credentialVersion,
			WorkloadDigest:    want.workloadDigest,
		})
		if err != nil {
			return nil, r.registryFailed(s, "create the registry connection", err)
		}
		r.event(s, corev1.EventTypeNormal, "Registered", "CreateConnection",
			fmt.Sprintf("registry connection %s created at config revision %d", conn.GetId(), conn.GetConfigRevision()))
	}
	if conn.GetState() == registryv1.ConnectionState_CONNECTION_STATE_RETIRED {
		msg := fmt.Sprintf("registry connection %s was retired outside the operator; delete and re-create the MCPServer to register it again", conn.GetId())
		r.setCondition(s, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonConnectionRetired, msg)
		r.event(s, corev1.EventTypeWarning, v1alpha1.ReasonConnectionRetired, "Register", msg)
		s.Status.ConnectionID = conn.GetId()
		return nil, nil
	}

	if !want.matches(conn) || conn.GetDisplayName() != displayName(s) || conn.GetOwner() != s.Spec.Owner {
		from := conn.GetConfigRevision()
		rotation := conn.GetCredentialVersion() != want.credentialVersion && conn.GetCredentialVersion() != "" &&
			conn.GetTransport().GetStreamableHttp().GetUrl() == want.url && conn.GetImageDigest() == want.imageDigest
		reason := fmt.Sprintf("MCPServer %s/%s generation %d", s.Namespace, s.Name, s.Generation)
		if rotation {
			reason = fmt.Sprintf("credential rotation: Secret %s", want.credentialVersion)
		}
		conn, err = r.Registry.UpdateConnection(ctx, &registryv1.UpdateConnectionRequest{
			Id:                     conn.GetId(),
			ExpectedConfigRevision: from,
			Transport:              transport,
			ImageDigest:            want.imageDigest,
			CredentialScope:        want.scope,
			CredentialVersion:      want.credentialVersion,
			WorkloadDigest:         want.workloadDigest,
			Reason:                 reason,
			// The pods of the new revision are not running yet: the
			// previous revision serves until reportRollout says they are.
			KeepServing: true,
			DisplayName: displayName(s),
			Owner:       s.Spec.Owner,
		})
		if err != nil {
			return nil, r.registryFailed(s, "update the registry connection", err)
		}
		if conn.GetConfigRevision() != from {
			r.event(s, corev1.EventTypeNormal, "ConfigRevised", "UpdateConnection",
				fmt.Sprintf("registry connection %s moved to config revision %d: %s", conn.GetId(), conn.GetConfigRevision(), reason))
		}
	}

	// A rotation is read from the status the operator last wrote, not from
	// whether this reconcile called the registry: when the registry moved
	// but the status write was lost (a conflict), the retry still sees the
	// credential change and records the rotation.
	if prev := s.Status.CredentialVersion; prev != "" && prev != conn.GetCredentialVersion() && s.Status.ConfigRevision < conn.GetConfigRevision() {
		s.Status.Rotation = &v1alpha1.RotationStatus{
			FromRevision:      s.Status.ConfigRevision,
			ToRevision:        conn.GetConfigRevision(),
			CredentialVersion: conn.GetCredentialVersion(),
			StartTime:         metav1.NewTime(r.now()),
		}
		r.event(s, corev1.EventTypeNormal, v1alpha1.ReasonRotationInProgress, "Rotate",
			fmt.Sprintf("credential rotated to %s: config revision %d, rolling the Deployment", conn.GetCredentialVersion(), conn.GetConfigRevision()))
	}

	s.Status.ConnectionID = conn.GetId()
	s.Status.ConfigRevision = conn.GetConfigRevision()
	s.Status.ConfigDigest = conn.GetConfigDigest()
	s.Status.ImageDigest = conn.GetImageDigest()
	s.Status.CredentialVersion = conn.GetCredentialVersion()
	s.Status.Endpoint = r.endpoint(s)
	return conn, nil
}

// reviewed reports whether conn's current configuration was approved in
// review. When it was not, Ready says what the server waits for and an
// event records the transition.
func (r *Reconciler) reviewed(s *v1alpha1.MCPServer, conn *registryv1.Connection) bool {
	typ, reason, msg := corev1.EventTypeNormal, "", ""
	switch conn.GetReviewState() {
	case registryv1.ReviewState_REVIEW_STATE_APPROVED:
		return true
	case registryv1.ReviewState_REVIEW_STATE_REJECTED:
		typ, reason = corev1.EventTypeWarning, v1alpha1.ReasonConnectionRejected
		msg = fmt.Sprintf("registry connection %s was rejected in review by %s at config revision %d; no pod of it is started. Change the MCPServer to propose a new configuration",
			conn.GetId(), conn.GetReviewedBy(), conn.GetReviewedConfigRevision())
	default:
		reason = v1alpha1.ReasonConnectionPending
		msg = fmt.Sprintf("the Deployment for config revision %d starts once a reviewer approves registry connection %s (RegistryService/ReviewConnection); no pod of an unreviewed configuration is started",
			conn.GetConfigRevision(), conn.GetId())
	}
	if c := meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Reason != reason || c.Message != msg {
		r.event(s, typ, reason, "AwaitReview", msg)
	}
	r.setCondition(s, v1alpha1.ConditionReady, metav1.ConditionFalse, reason, msg)
	return false
}

// currentConnection returns s's connection. With no id in the status it
// looks for one registered for the same endpoint (a create whose status
// write was lost) before the caller creates another.
func (r *Reconciler) currentConnection(ctx context.Context, s *v1alpha1.MCPServer) (*registryv1.Connection, error) {
	if id := s.Status.ConnectionID; id != "" {
		c, err := r.Registry.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: id})
		if status.Code(err) == codes.NotFound {
			return nil, nil
		}
		return c, err
	}
	list, err := r.Registry.ListConnections(ctx, &registryv1.ListConnectionsRequest{PageSize: maxPageSize})
	if err != nil {
		return nil, err
	}
	// The endpoint names the server's own Service in its namespace, so no
	// other MCPServer registers it.
	endpoint := r.endpoint(s)
	var found *registryv1.Connection
	for _, c := range list.GetConnections() {
		if c.GetTransport().GetStreamableHttp().GetUrl() == endpoint && c.GetOwner() == s.Spec.Owner &&
			c.GetState() != registryv1.ConnectionState_CONNECTION_STATE_RETIRED {
			found = c // newest wins: the list is oldest first
		}
	}
	return found, nil
}

// registryFailed records a registry error in the Ready condition and an
// event, and returns it so the rate limiter backs off. Invalid requests are
// not retried: the spec must change first.
func (r *Reconciler) registryFailed(s *v1alpha1.MCPServer, what string, err error) error {
	reason := v1alpha1.ReasonRegistryUnavailable
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied:
		reason = v1alpha1.ReasonRegistryRejected
	}
	msg := fmt.Sprintf("could not %s: %s", what, status.Convert(err).Message())
	r.setCondition(s, v1alpha1.ConditionReady, metav1.ConditionFalse, reason, msg)
	r.event(s, corev1.EventTypeWarning, reason, "Register", msg)
	if reason == v1alpha1.ReasonRegistryRejected {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// observeRegistry records discovery and review state. Failures leave the
// conditions Unknown rather than failing the reconcile: the workload is
// fine, and the next resync looks again.
func (r *Reconciler) observeRegistry(ctx context.Context, s *v1alpha1.MCPServer, conn *registryv1.Connection) {
	if id := conn.GetLatestSnapshotId(); id == "" {
		r.setCondition(s, v1alpha1.ConditionDiscovered, metav1.ConditionFalse, v1alpha1.ReasonAwaitingDiscovery,
			"the adapter has not yet recorded a discovery snapshot of this connection")
	} else if snap, err := r.Registry.GetSnapshot(ctx, &registryv1.GetSnapshotRequest{Id: id}); err != nil {
		r.setCondition(s, v1alpha1.ConditionDiscovered, metav1.ConditionUnknown, v1alpha1.ReasonRegistryUnavailable,
			"could not read the latest snapshot: "+status.Convert(err).Message())
	} else {
		s.Status.LatestSnapshotDigest = snap.GetDigest()
		if snap.GetConfigRevision() == conn.GetConfigRevision() {
			r.setCondition(s, v1alpha1.ConditionDiscovered, metav1.ConditionTrue, v1alpha1.ReasonSnapshotRecorded,
				fmt.Sprintf("snapshot %s taken at config revision %d", snap.GetId(), snap.GetConfigRevision()))
		} else {
			r.setCondition(s, v1alpha1.ConditionDiscovered, metav1.ConditionFalse, v1alpha1.ReasonSnapshotOutdated,
				fmt.Sprintf("latest snapshot %s was taken at config revision %d, not %d", snap.GetId(), snap.GetConfigRevision(), conn.GetConfigRevision()))
		}
	}

	switch conn.GetReviewState() {
	case registryv1.ReviewState_REVIEW_STATE_PENDING:
		r.setCondition(s, v1alpha1.ConditionReviewRequired, metav1.ConditionTrue, v1alpha1.ReasonConnectionPending,
			"the registry connection waits for review; no capability can use it before then")
		return
	case registryv1.ReviewState_REVIEW_STATE_REJECTED:
		r.setCondition(s, v1alpha1.ConditionReviewRequired, metav1.ConditionTrue, v1alpha1.ReasonConnectionRejected,
			"the registry connection was rejected in review")
		return
	}
	m, err := r.Registry.ListMappings(ctx, &registryv1.ListMappingsRequest{
		ConnectionId: conn.GetId(), State: registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED, PageSize: maxPageSize})
	switch {
	case err != nil:
		r.setCondition(s, v1alpha1.ConditionReviewRequired, metav1.ConditionUnknown, v1alpha1.ReasonRegistryUnavailable,
			"could not list mappings: "+status.Convert(err).Message())
	case len(m.GetMappings()) > 0:
		r.setCondition(s, v1alpha1.ConditionReviewRequired, metav1.ConditionTrue, v1alpha1.ReasonMappingsNeedReview,
			fmt.Sprintf("%d mappings need review after config revision %d", len(m.GetMappings()), conn.GetConfigRevision()))
	default:
		r.setCondition(s, v1alpha1.ConditionReviewRequired, metav1.ConditionFalse, v1alpha1.ReasonReviewed, "nothing waits for review")
	}
}

// retire retires s's registry connection. A connection already retired or
// gone is fine: the point is that it is not used again.
func (r *Reconciler) retire(ctx context.Context, s *v1alpha1.MCPServer) error {
	id := s.Status.ConnectionID
	if id == "" {
		return nil
	}
	_, err := r.Registry.RetireConnection(ctx, &registryv1.RetireConnectionRequest{
		Id: id, Reason: fmt.Sprintf("MCPServer %s/%s deleted", s.Namespace, s.Name)})
	switch status.Code(err) {
	case codes.OK:
		r.event(s, corev1.EventTypeNormal, "Retired", "RetireConnection",
			fmt.Sprintf("registry connection %s retired; its history stays readable", id))
	case codes.NotFound, codes.FailedPrecondition:
	default:
		r.event(s, corev1.EventTypeWarning, v1alpha1.ReasonRegistryUnavailable, "RetireConnection",
			fmt.Sprintf("could not retire registry connection %s: %s", id, status.Convert(err).Message()))
		return fmt.Errorf("retire connection %s: %w", id, err)
	}
	return nil
}

// maxPageSize is the registry's largest list page (paging.MaxSize): the
// operator reads its own servers' connections and mappings, far fewer.
const maxPageSize = 1000
