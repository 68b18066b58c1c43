package controller

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
)

// A Deployment's status counts for a config revision only when its pod
// template is that revision's: a stale read of the previous template,
// rolled out or given up on, says nothing about the new one.
func TestRolledOutAtRevision(t *testing.T) {
	t.Parallel()
	deployment := func(rev string, st appsv1.DeploymentStatus) *appsv1.Deployment {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: 4}, Status: st}
		d.Spec.Template.Annotations = map[string]string{AnnotationConfigRevision: rev}
		return d
	}
	ready := appsv1.DeploymentStatus{ObservedGeneration: 4, Replicas: 1, UpdatedReplicas: 1, AvailableReplicas: 1}
	deadline := appsv1.DeploymentStatus{ObservedGeneration: 4, Replicas: 2, UpdatedReplicas: 1, Conditions: []appsv1.DeploymentCondition{{
		Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: reasonProgressDeadlineExceeded, Message: "timed out"}}}
	r := &Reconciler{Options: Options{}.withDefaults()}
	for _, tc := range []struct {
		name        string
		d           *appsv1.Deployment
		rev         int64
		wantDone    bool
		wantFailure bool
	}{
		{"rolled out at the revision", deployment("3", ready), 3, true, false},
		{"a stale read of the previous template", deployment("2", ready), 3, false, false},
		{"progress deadline at the revision", deployment("3", deadline), 3, false, true},
		{"progress deadline of the previous template", deployment("2", deadline), 3, false, false},
		{"the controller has not seen the template", deployment("3", appsv1.DeploymentStatus{ObservedGeneration: 3, Replicas: 1, UpdatedReplicas: 1, AvailableReplicas: 1}), 3, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			done, why := rolledOutAt(tc.d, tc.rev)
			if done != tc.wantDone {
				t.Errorf("rolledOutAt = %v (%s), want %v", done, why, tc.wantDone)
			}
			failure, _ := r.rolloutFailure(&v1alpha1.MCPServer{}, tc.d, tc.rev, why)
			if (failure != "") != tc.wantFailure {
				t.Errorf("rolloutFailure = %q, want a failure: %v", failure, tc.wantFailure)
			}
		})
	}
}
