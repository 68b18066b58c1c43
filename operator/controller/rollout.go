package controller

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// reasonProgressDeadlineExceeded is the Deployment controller's reason on
// the Progressing condition of a rollout that stopped making progress.
const reasonProgressDeadlineExceeded = "ProgressDeadlineExceeded"

// reportRollout tells the registry how the rollout of conn's latest config
// revision went: available pods make it the serving revision (the registry
// switches only now, so no call is made at a revision whose credential is
// not in place); a rollout that failed is recorded, and the previous
// revision keeps serving. It returns the connection as the registry now
// holds it and when to look again.
func (r *Reconciler) reportRollout(ctx context.Context, s *v1alpha1.MCPServer, conn *registryv1.Connection, d *appsv1.Deployment) (*registryv1.Connection, time.Duration, error) {
	latest := conn.GetConfigRevision()
	done, why := rolledOutAt(d, latest)
	again := resyncPeriod
	var (
		next = conn
		err  error
	)
	switch {
	case conn.GetServingConfigRevision() >= latest:
	case done:
		next, err = r.Registry.ReportRollout(ctx, &registryv1.ReportRolloutRequest{Id: conn.GetId(), ConfigRevision: latest, Ready: true})
		if err == nil {
			r.event(s, corev1.EventTypeNormal, "RevisionServing", "ReportRollout",
				fmt.Sprintf("config revision %d serves: its pods are available (revision %d served until now)", latest, conn.GetServingConfigRevision()))
		}
	default:
		failure, wait := r.rolloutFailure(s, d, latest, why)
		switch {
		case failure == "":
			again = wait
		case conn.GetRolloutFailure().GetConfigRevision() != latest:
			next, err = r.Registry.ReportRollout(ctx, &registryv1.ReportRolloutRequest{Id: conn.GetId(), ConfigRevision: latest, Detail: failure})
			if err == nil {
				r.event(s, corev1.EventTypeWarning, failedReason(s, latest), "ReportRollout",
					fmt.Sprintf("config revision %d did not roll out (%s); revision %d keeps serving", latest, failure, conn.GetServingConfigRevision()))
			}
		}
	}
	if err != nil {
		r.observeServing(s, conn, why)
		return conn, again, fmt.Errorf("report the rollout of config revision %d: %w", latest, err)
	}
	r.observeServing(s, next, why)
	return next, again, nil
}

// rolloutFailure says why the rollout of revision latest failed, or ""
// with how long until it would time out. It failed when the Deployment
// controller gave up on it (its progress deadline), or, for a credential
// rotation, when its pods were not available within RolloutTimeout of the
// Secret's change: a server that refuses its new credential never becomes
// ready.
func (r *Reconciler) rolloutFailure(s *v1alpha1.MCPServer, d *appsv1.Deployment, latest int64, why string) (string, time.Duration) {
	// Only the Deployment controller's verdict on this revision's pod
	// template counts, not one on a template a stale read still shows.
	if d.Status.ObservedGeneration >= d.Generation && d.Spec.Template.Annotations[AnnotationConfigRevision] == itoa64(latest) {
		for _, c := range d.Status.Conditions {
			if c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse && c.Reason == reasonProgressDeadlineExceeded {
				return fmt.Sprintf("%s: %s", reasonProgressDeadlineExceeded, c.Message), 0
			}
		}
	}
	rot := s.Status.Rotation
	if rot == nil || rot.ToRevision != latest || rot.CompletionTime != nil {
		return "", resyncPeriod
	}
	if left := rot.StartTime.Add(r.Options.RolloutTimeout).Sub(r.now()); left > 0 {
		return "", left
	}
	return fmt.Sprintf("the pods were not available within %s of the credential change (%s)", r.Options.RolloutTimeout, why), 0
}

// failedReason is RotationFailed for the revision a credential rotation
// created, RolloutFailed for any other.
func failedReason(s *v1alpha1.MCPServer, latest int64) string {
	if rot := s.Status.Rotation; rot != nil && rot.ToRevision == latest {
		return v1alpha1.ReasonRotationFailed
	}
	return v1alpha1.ReasonRolloutFailed
}

// observeServing records which revision serves and why not the latest.
func (r *Reconciler) observeServing(s *v1alpha1.MCPServer, conn *registryv1.Connection, why string) {
	latest, current := conn.GetConfigRevision(), conn.GetServingConfigRevision()
	s.Status.ServingConfigRevision = current
	switch f := conn.GetRolloutFailure(); {
	case current >= latest:
		r.setCondition(s, v1alpha1.ConditionServing, metav1.ConditionTrue, v1alpha1.ReasonServingLatest,
			fmt.Sprintf("config revision %d serves", current))
	case f.GetConfigRevision() == latest:
		reason := failedReason(s, latest)
		msg := fmt.Sprintf("config revision %d did not roll out (%s); revision %d keeps serving", latest, f.GetDetail(), current)
		if reason == v1alpha1.ReasonRotationFailed && s.Status.Rotation.CompletionTime == nil {
			s.Status.Rotation.Failure = f.GetDetail()
			r.setCondition(s, v1alpha1.ConditionCredentialsReady, metav1.ConditionFalse, v1alpha1.ReasonRotationFailed, msg)
		}
		r.setCondition(s, v1alpha1.ConditionServing, metav1.ConditionFalse, reason, msg)
	default:
		r.setCondition(s, v1alpha1.ConditionServing, metav1.ConditionFalse, v1alpha1.ReasonRolloutPending,
			fmt.Sprintf("config revision %d serves until the pods of revision %d are available: %s", current, latest, why))
	}
}
