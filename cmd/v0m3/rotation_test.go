package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
)

// The rotation table shows each server's revision, credential version and
// whether its latest rotation is still rolling.
func TestPrintRotation(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	done := metav1.NewTime(now.Add(-time.Minute))
	servers := []v1alpha1.MCPServer{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "search"}, Status: v1alpha1.MCPServerStatus{
			ConfigRevision: 3, CredentialVersion: "search-token@812",
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionCredentialsReady, Reason: v1alpha1.ReasonRotationInProgress}},
			Rotation:   &v1alpha1.RotationStatus{FromRevision: 2, ToRevision: 3, CredentialVersion: "search-token@812", StartTime: metav1.NewTime(now.Add(-30 * time.Second))},
		}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "links"}, Status: v1alpha1.MCPServerStatus{
			ConfigRevision: 2, CredentialVersion: "links-key@77",
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionCredentialsReady, Reason: v1alpha1.ReasonCredentialsCurrent}},
			Rotation:   &v1alpha1.RotationStatus{FromRevision: 1, ToRevision: 2, StartTime: metav1.NewTime(now.Add(-2 * time.Minute)), CompletionTime: &done},
		}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "render"}, Status: v1alpha1.MCPServerStatus{ConfigRevision: 1}},
	}
	var out bytes.Buffer
	if err := printRotation(&out, servers, now); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("got %d lines:\n%s", len(lines), out.String())
	}
	for i, want := range [][]string{
		{"search", "3", "search-token@812", "RotationInProgress", "2 -> 3", "30s ago", "in progress"},
		{"links", "2", "links-key@77", "CredentialsCurrent", "1 -> 2", "2m0s ago", "1m0s later"},
		{"render", "1", "-"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i+1], w) {
				t.Errorf("line %q lacks %q", lines[i+1], w)
			}
		}
	}
}
