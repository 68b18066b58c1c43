package tasks

import (
	"testing"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// TestSamePayload: a retry is the same StartTask only when everything
// that shapes the task is the same.
func TestSamePayload(t *testing.T) {
	t.Parallel()
	scope := []*orchestratorv1.SourceRef{{Uri: "s://a", Title: "A"}, {Uri: "s://b", Title: "B"}}
	task := &orchestratorv1.Task{
		Requester: &policyv1.Principal{Id: "alice", Groups: []string{"authors"}}, Purpose: "review",
		SourceScope: scope, Profile: "source_review",
	}
	base := func() *orchestratorv1.StartTaskRequest {
		return &orchestratorv1.StartTaskRequest{Profile: "source_review", Purpose: "review", SourceScope: scope, RequestId: "k"}
	}
	alice := &policyv1.Principal{Id: "alice"}
	for _, tc := range []struct {
		name      string
		change    func(*orchestratorv1.StartTaskRequest)
		requester *policyv1.Principal
		actor     string
		same      bool
	}{
		{"identical", func(*orchestratorv1.StartTaskRequest) {}, alice, "", true},
		{"groups renewed", func(*orchestratorv1.StartTaskRequest) {}, &policyv1.Principal{Id: "alice", Groups: []string{"authors", "x"}}, "", true},
		{"kind naming the same profile", func(r *orchestratorv1.StartTaskRequest) {
			r.Profile = ""
			//lint:ignore SA1019 a retry may still name the deprecated kind.
			r.Kind = orchestratorv1.TaskKind_TASK_KIND_SOURCE_REVIEW
		}, alice, "", false}, // the task recorded no kind
		{"purpose", func(r *orchestratorv1.StartTaskRequest) { r.Purpose = "other" }, alice, "", false},
		{"profile", func(r *orchestratorv1.StartTaskRequest) { r.Profile = "rewrite" }, alice, "", false},
		{"evidence", func(r *orchestratorv1.StartTaskRequest) { r.EvidencePresent = true }, alice, "", false},
		{"sources reordered", func(r *orchestratorv1.StartTaskRequest) {
			r.SourceScope = []*orchestratorv1.SourceRef{scope[1], scope[0]}
		}, alice, "", false},
		{"source retitled", func(r *orchestratorv1.StartTaskRequest) {
			r.SourceScope = []*orchestratorv1.SourceRef{scope[0], {Uri: "s://b", Title: "other"}}
		}, alice, "", false},
		{"fewer sources", func(r *orchestratorv1.StartTaskRequest) { r.SourceScope = scope[:1] }, alice, "", false},
		{"another requester", func(*orchestratorv1.StartTaskRequest) {}, &policyv1.Principal{Id: "bob"}, "", false},
		{"an actor", func(*orchestratorv1.StartTaskRequest) {}, alice, "svc", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := base()
			tc.change(r)
			if got := samePayload(r, task, tc.requester, tc.actor); got != tc.same {
				t.Errorf("samePayload = %v, want %v", got, tc.same)
			}
		})
	}
}

// TestIdempotentTaskID: the id depends on every part of the key, and the
// parts cannot run into each other.
func TestIdempotentTaskID(t *testing.T) {
	t.Parallel()
	ids := map[string]string{}
	for name, parts := range map[string][3]string{
		"base": {"alice", "", "k"}, "requester": {"bob", "", "k"}, "actor": {"alice", "svc", "k"},
		"key": {"alice", "", "k2"}, "shifted": {"alic", "e", "k"}, "shifted key": {"alice", "k", ""},
	} {
		id := IdempotentID(parts[0], parts[1], parts[2])
		if other, dup := ids[id]; dup {
			t.Errorf("%s and %s share task id %s", name, other, id)
		}
		ids[id] = name
	}
	first, again := IdempotentID("alice", "", "k"), IdempotentID("alice", "", "k")
	if first != again {
		t.Error("the id is not deterministic")
	}
}
