package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
)

// The rotation table shows each server's serving and latest revision, its
// rollout's progress, credential version and whether its latest rotation
// is still rolling, done or failed.
func TestPrintRotation(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	done := metav1.NewTime(now.Add(-time.Minute))
	servers := []v1alpha1.MCPServer{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "search"}, Status: v1alpha1.MCPServerStatus{
			ConfigRevision: 3, ServingConfigRevision: 2, DesiredReplicas: 2, UpdatedReadyReplicas: 1, CredentialVersion: "search-token@812",
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionCredentialsReady, Reason: v1alpha1.ReasonRotationInProgress}},
			Rotation:   &v1alpha1.RotationStatus{FromRevision: 2, ToRevision: 3, CredentialVersion: "search-token@812", StartTime: metav1.NewTime(now.Add(-30 * time.Second))},
		}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "links"}, Status: v1alpha1.MCPServerStatus{
			ConfigRevision: 2, ServingConfigRevision: 2, DesiredReplicas: 1, UpdatedReadyReplicas: 1, CredentialVersion: "links-key@77",
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionCredentialsReady, Reason: v1alpha1.ReasonCredentialsCurrent}},
			Rotation:   &v1alpha1.RotationStatus{FromRevision: 1, ToRevision: 2, StartTime: metav1.NewTime(now.Add(-2 * time.Minute)), CompletionTime: &done},
		}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "render"}, Status: v1alpha1.MCPServerStatus{ConfigRevision: 1}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "notes"}, Status: v1alpha1.MCPServerStatus{
			ConfigRevision: 5, ServingConfigRevision: 4, DesiredReplicas: 1, CredentialVersion: "notes-token@9",
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionCredentialsReady, Reason: v1alpha1.ReasonRotationFailed}},
			Rotation: &v1alpha1.RotationStatus{FromRevision: 4, ToRevision: 5, StartTime: metav1.NewTime(now.Add(-11 * time.Minute)),
				Failure: "ProgressDeadlineExceeded: ReplicaSet notes-5 has timed out progressing"},
		}},
	}
	var out bytes.Buffer
	if err := printRotation(&out, servers, now); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("got %d lines:\n%s", len(lines), out.String())
	}
	for i, want := range [][]string{
		{"search", "2", "3", "1/2", "search-token@812", "RotationInProgress", "2 -> 3", "30s ago", "in progress"},
		{"links", "2", "2", "1/1", "links-key@77", "CredentialsCurrent", "1 -> 2", "2m0s ago", "1m0s later"},
		{"render", "-", "1", "-", "-"},
		{"notes", "4", "5", "0/1", "notes-token@9", "RotationFailed", "4 -> 5", "11m0s ago", "failed"},
	} {
		// tabwriter pads columns with at least two spaces.
		if got := columns.Split(lines[i+1], -1)[1 : len(want)+1]; strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("line %q: columns %q, want %q", lines[i+1], got, want)
		}
	}
}

var columns = regexp.MustCompile(`\s{2,}`)

// waitRotation returns once no listed server is rotating, and fails naming
// the servers still rolling out when the wait ends first.
func TestWaitRotation(t *testing.T) {
	t.Parallel()
	rolling := v1alpha1.MCPServer{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "search"}, Status: v1alpha1.MCPServerStatus{
		ConfigRevision: 3,
		Conditions:     []metav1.Condition{{Type: v1alpha1.ConditionCredentialsReady, Reason: v1alpha1.ReasonRotationInProgress}},
		Rotation:       &v1alpha1.RotationStatus{FromRevision: 2, ToRevision: 3, StartTime: metav1.Now()},
	}}
	current := *rolling.DeepCopy()
	done := metav1.Now()
	current.Status.Rotation.CompletionTime = &done
	current.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionCredentialsReady, Reason: v1alpha1.ReasonCredentialsCurrent}}
	failed := *rolling.DeepCopy()
	failed.Status.Rotation.Failure = "the pods were not available within 10m0s of the credential change"
	failed.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionCredentialsReady, Reason: v1alpha1.ReasonRotationFailed}}
	idle := v1alpha1.MCPServer{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "render"}, Status: v1alpha1.MCPServerStatus{ConfigRevision: 1}}

	tests := []struct {
		name    string
		states  [][]v1alpha1.MCPServer // what each successive list returns; the last repeats
		wantErr string
	}{
		{"completes after rolling", [][]v1alpha1.MCPServer{{rolling, idle}, {rolling, idle}, {current, idle}}, ""},
		{"nothing rotating", [][]v1alpha1.MCPServer{{idle}}, ""},
		{"still rolling when the wait ends", [][]v1alpha1.MCPServer{{rolling, idle}}, "mcp/search still rolling out"},
		{"fails at once when a rotation failed", [][]v1alpha1.MCPServer{{rolling, idle}, {failed, idle}}, "mcp/search: the pods were not available within 10m0s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			calls := 0
			list := func(context.Context) ([]v1alpha1.MCPServer, error) {
				s := tc.states[min(calls, len(tc.states)-1)]
				calls++
				return s, nil
			}
			var out bytes.Buffer
			err := waitRotation(ctx, list, 10*time.Millisecond, &out)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("wait: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("wait = %v; want an error saying %q", err, tc.wantErr)
			}
			if !strings.Contains(out.String(), "NAMESPACE") {
				t.Errorf("no table printed:\n%s", out.String())
			}
		})
	}

	// A list that fails ends the wait with its error.
	boom := errors.New("list MCPServers: connection refused")
	if err := waitRotation(t.Context(), func(context.Context) ([]v1alpha1.MCPServer, error) { return nil, boom }, time.Millisecond, io.Discard); !errors.Is(err, boom) {
		t.Errorf("wait with a failing list = %v, want %v", err, boom)
	}
}
