package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	"github.com/v0m3/v0m3/suite"
)

// TestAuditExport: `v0m3 audit --jsonl` pages through the whole log and
// prints one JSON record a line, in order; the table names each record.
func TestAuditExport(t *testing.T) {
	t.Parallel()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	admin := s.As(context.Background(), "pat", "policy-admins")
	const reloads = 5
	for range reloads {
		if _, err := s.Policy.ReloadPolicy(admin, &policyv1.ReloadPolicyRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	auditor := s.As(context.Background(), "ada", "auditors")
	var out bytes.Buffer
	// Page size 2: three pages.
	if err := exportAudit(auditor, s.Evidence, &evidencev1.ListAuditRecordsRequest{PageSize: 2, Action: "policy.reload"}, true, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != reloads {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), reloads, out.String())
	}
	last := int64(0)
	for _, l := range lines {
		var rec struct {
			Sequence  string `json:"sequence"`
			Principal string `json:"principal"`
			Action    string `json:"action"`
			Outcome   string `json:"outcome"`
		}
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if rec.Principal != "pat" || rec.Action != "policy.reload" || rec.Outcome != "ok" {
			t.Errorf("record %q", l)
		}
		var seq int64
		if err := json.Unmarshal([]byte(rec.Sequence), &seq); err != nil || seq <= last {
			t.Errorf("sequence %q after %d: not in order", rec.Sequence, last)
		}
		last = seq
	}
	out.Reset()
	if err := exportAudit(auditor, s.Evidence, &evidencev1.ListAuditRecordsRequest{}, false, &out); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "policy.reload"); n != reloads {
		t.Errorf("the table lists %d reloads, want %d:\n%s", n, reloads, out.String())
	}
	// Someone who is not an auditor gets the refusal, not an empty export.
	out.Reset()
	err = exportAudit(s.As(context.Background(), "mallory", "authors"), s.Evidence, &evidencev1.ListAuditRecordsRequest{}, true, &out)
	if err == nil || out.Len() != 0 {
		t.Errorf("a non-auditor exported %q (err %v)", out.String(), err)
	}
}
