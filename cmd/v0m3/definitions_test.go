package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/registry"
	"github.com/v0m3/v0m3/suite"
)

const searchNotesYAML = `
name: search_notes
effect_class: EFFECT_CLASS_RETRIEVAL
description: Search one notebook this task may read for entries matching a short query.
input_schema:
  type: object
  properties:
    notebook: {$ref: "#/$defs/handle"}
    query: {type: string, maxLength: 200}
  required: [notebook, query]
  additionalProperties: false
  $defs:
    handle: {type: string, minLength: 1}
handles:
  - {field: notebook, refers_to: notebook}
retry_rule: RETRY_RULE_RETRY
result_kind: RESULT_KIND_DATA
summary_template: Search notebook {notebook} for {query}
managed_by: team-notes
`

const notesReviewYAML = `
name: notes_review
purpose: source_review
needs:
  - {capability: search_notes, when: NEED_CONDITION_EVIDENCE_ABSENT}
`

// cli runs the registry and the policy service and returns a function
// running `v0m3 <args>` as a member of groups.
func cli(t *testing.T) func(groups string, args ...string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: dir, Services: []string{suite.Registry, suite.Policy}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return func(groups string, args ...string) (string, error) {
		tok, err := s.Dev.Issuer.Mint("ines", strings.Split(groups, ","), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "--registry-addr", s.Addr[suite.Registry], "--token", tok, "--tls-ca-file", filepath.Join(dir, "pki", "ca.crt"))
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		switch args[0] {
		case "capability":
			err = runCapability(ctx, args[1:], &out, &bytes.Buffer{})
		default:
			err = runProfile(ctx, args[1:], &out, &bytes.Buffer{})
		}
		return out.String(), err
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "definition.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestApplyCapability: apply creates, then reports an identical file as
// unchanged, then a changed one as a new revision; get reads any revision
// back in the form apply takes.
func TestApplyCapability(t *testing.T) {
	t.Parallel()
	v0m3 := cli(t)
	file := writeFile(t, searchNotesYAML)
	steps := []struct {
		file, want string
	}{
		{file, "capability search_notes: created at revision 1"},
		{file, "capability search_notes: unchanged at revision 1"},
		{writeFile(t, strings.Replace(searchNotesYAML, "a short query.", "a short query. Entries are dated.", 1)),
			"capability search_notes: updated to revision 2; its active mappings need review against it"},
		{writeFile(t, strings.Replace(searchNotesYAML, "a short query.", "a short query. Entries are dated.", 1)), "capability search_notes: unchanged at revision 2"},
	}
	for i, st := range steps {
		out, err := v0m3("platform", "capability", "apply", "-f", st.file)
		if err != nil || strings.TrimSpace(out) != st.want {
			t.Fatalf("apply %d = %q, %v; want %q", i, out, err, st.want)
		}
	}
	out, err := v0m3("authors", "capability", "get", "search_notes", "--revision", "1")
	if err != nil {
		t.Fatal(err)
	}
	got := &registryv1.Capability{}
	if err := registry.DecodeDefinition([]byte(out), got); err != nil {
		t.Fatalf("get output does not read back: %v\n%s", err, out)
	}
	if got.GetRevision() != 1 || strings.Contains(got.GetDescription(), "dated") || got.GetCreatedBy() != "ines" ||
		got.GetInputSchema().GetFields()["properties"].GetStructValue().GetFields()["notebook"].GetStructValue().GetFields()["type"].GetStringValue() != "string" {
		t.Errorf("revision 1 = %v", got)
	}
	// What get printed applies as it is (output-only fields are
	// ignored): applying revision 1 again declares it as revision 3.
	old := writeFile(t, out)
	for _, want := range []string{"updated to revision 3", "unchanged at revision 3"} {
		if out, err := v0m3("platform", "capability", "apply", "-f", old); err != nil || !strings.Contains(out, want) {
			t.Errorf("re-applying revision 1 = %q, %v; want %q", out, err, want)
		}
	}
	list, err := v0m3("authors", "capability", "list")
	if err != nil || !strings.Contains(list, "search_notes") || !strings.Contains(list, "retrieve_authorized_source") {
		t.Errorf("list = %q, %v", list, err)
	}
	// A deprecation names the revision its author read: revision 2 was
	// replaced, so it is refused.
	if out, err := v0m3("platform", "capability", "deprecate", "search_notes", "--reason", "moved to the wiki", "--expected-revision", "2"); err == nil || !strings.Contains(err.Error(), "REVISION_CONFLICT") {
		t.Errorf("deprecate revision 2 of 3 = %q, %v; want REVISION_CONFLICT", out, err)
	}
	if out, err := v0m3("platform", "capability", "deprecate", "search_notes", "--reason", "moved to the wiki", "--expected-revision", "3"); err != nil || !strings.Contains(out, "deprecated at revision 3") {
		t.Errorf("deprecate = %q, %v", out, err)
	}
	if list, _ := v0m3("authors", "capability", "list"); strings.Contains(list, "search_notes") {
		t.Errorf("list shows the deprecated capability:\n%s", list)
	}
	if list, _ := v0m3("authors", "capability", "list", "--all"); !strings.Contains(list, "deprecated") {
		t.Errorf("list --all hides it:\n%s", list)
	}
}

// TestApplyRefusals: a caller outside the platform group, an unknown field
// and an invalid contract are refused with a reason, and store nothing.
func TestApplyRefusals(t *testing.T) {
	t.Parallel()
	v0m3 := cli(t)
	file := writeFile(t, searchNotesYAML)
	if out, err := v0m3("authors", "capability", "apply", "-f", file); err == nil || !strings.Contains(err.Error(), "ROLE_NOT_GRANTED") {
		t.Errorf("apply as an author = %q, %v; want ROLE_NOT_GRANTED", out, err)
	}
	if _, err := v0m3("platform", "capability", "apply", "-f", writeFile(t, searchNotesYAML+"handle_fields: [notebook]\n")); err == nil || !strings.Contains(err.Error(), "handle_fields") {
		t.Errorf("unknown field: %v; want it named", err)
	}
	bad := strings.Replace(searchNotesYAML, "{query}", "{terms}", 1)
	if _, err := v0m3("platform", "capability", "apply", "-f", writeFile(t, bad)); err == nil || !strings.Contains(err.Error(), "INVALID_SUMMARY_TEMPLATE") || !strings.Contains(err.Error(), "{terms}") {
		t.Errorf("invalid template: %v; want the reason and the placeholder", err)
	}
	if _, err := v0m3("platform", "capability", "get", "search_notes"); err == nil || !strings.Contains(err.Error(), "CAPABILITY_UNKNOWN") {
		t.Errorf("after refusals get = %v; want CAPABILITY_UNKNOWN", err)
	}
	if _, err := v0m3("platform", "capability", "apply"); err == nil {
		t.Error("apply without -f succeeded")
	}
}

// TestApplyProfile: the same create, unchanged and update paths for task
// profiles, which need their capabilities declared first.
func TestApplyProfile(t *testing.T) {
	t.Parallel()
	v0m3 := cli(t)
	profile := writeFile(t, notesReviewYAML)
	if _, err := v0m3("platform", "profile", "apply", "-f", profile); err == nil || !strings.Contains(err.Error(), "CAPABILITY_UNKNOWN") {
		t.Errorf("profile before its capability: %v; want CAPABILITY_UNKNOWN", err)
	}
	if _, err := v0m3("platform", "capability", "apply", "-f", writeFile(t, searchNotesYAML)); err != nil {
		t.Fatal(err)
	}
	changed := writeFile(t, notesReviewYAML+"default_budget: {max_calls: 5}\n")
	for i, st := range []struct{ file, want string }{
		{profile, "profile notes_review: created at revision 1"},
		{profile, "profile notes_review: unchanged at revision 1"},
		{changed, "profile notes_review: updated to revision 2"},
	} {
		if out, err := v0m3("platform", "profile", "apply", "-f", st.file); err != nil || strings.TrimSpace(out) != st.want {
			t.Fatalf("apply %d = %q, %v; want %q", i, out, err, st.want)
		}
	}
	list, err := v0m3("authors", "profile", "list")
	if err != nil || !strings.Contains(list, "notes_review") || !strings.Contains(list, "search_notes") || !strings.Contains(list, "source_review") {
		t.Errorf("profile list = %q, %v", list, err)
	}
}
