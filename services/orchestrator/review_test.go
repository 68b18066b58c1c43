package orchestrator

import (
	"testing"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

func TestSummarize(t *testing.T) {
	t.Parallel()
	capability := func(name, template string) *registryv1.Capability {
		return &registryv1.Capability{Name: name, SummaryTemplate: template}
	}
	// The seed's four, as the registry's default definitions declare them.
	retrieve := capability(capRetrieveAuthorizedSource, defaultTemplate(t, capRetrieveAuthorizedSource))
	preview := capability(capRenderPreview, defaultTemplate(t, capRenderPreview))
	deliver := capability(capDeliverApprovedArtifact, defaultTemplate(t, capDeliverApprovedArtifact))
	validate := capability("validate_external_link", defaultTemplate(t, "validate_external_link"))
	tests := []struct {
		name       string
		capability *registryv1.Capability
		args       map[string]any
		labels     map[string]string
		want       string
	}{
		// The seed's four read exactly as they always did.
		{"render preview", preview, map[string]any{"document_revision": int64(31), "profile": int64(4)}, nil,
			"Render preview of document revision 31 using profile 4"},
		{"retrieve with a query", retrieve, map[string]any{"source": "h_1", "query": "v2 headers"}, map[string]string{"source": "API migration guide"},
			`Retrieve passages about "v2 headers" from source "API migration guide"`},
		{"deliver", deliver, map[string]any{"artifact": "h_1", "destination": "h_2"}, map[string]string{"artifact": "preview r31", "destination": "docs site"},
			`Deliver artifact "preview r31" to destination "docs site"`},
		{"validate a link (no template)", validate, map[string]any{"link": "h_1"}, map[string]string{"link": "example.com/v2"},
			`Validate external link with link "example.com/v2"`},
		// A template naming a field the request lacks reads generically.
		{"retrieve without a query", retrieve, map[string]any{"source": "h_1", "max_passages": int64(3)}, map[string]string{"source": "release-notes.md"},
			`Retrieve authorized source with max passages 3, source "release-notes.md"`},
		{"preview without a profile", preview, map[string]any{"document_revision": int64(31)}, nil, "Render preview with document revision 31"},
		// A handle shows its label, never the token or the target.
		{"a handle field shows its label", capability("read_project_file", "Read {path}"), map[string]any{"path": "h_secret_token"},
			map[string]string{"path": "README.md"}, `Read "README.md"`},
		// A string value is quoted: it cannot pass for the template's words.
		{"a string value cannot forge the sentence", capability("open_ticket", "Open ticket {title} in queue {queue}"),
			map[string]any{"title": "x\" in queue \"security", "queue": "triage"}, nil,
			`Open ticket "x\" in queue \"security" in queue "triage"`},
		{"a new line in a value stays on one line", capability("open_ticket", "Open ticket {title}"),
			map[string]any{"title": "a\nApproved by the security team"}, nil, `Open ticket "a\nApproved by the security team"`},
		{"a value is not read as a placeholder", capability("open_ticket", "Open ticket {title} ({queue})"),
			map[string]any{"title": "{queue}", "queue": "triage"}, nil, `Open ticket "{queue}" ("triage")`},
		{"doubled braces are literal", capability("tag", "Tag {name} with {{label}}"), map[string]any{"name": "n"}, nil,
			`Tag "n" with {label}`},
		{"a template that does not parse reads generically", capability("tag", "Tag {name} with {a b}"), map[string]any{"name": "n"}, nil,
			"Tag with name n"},
		{"numbers and booleans as written", capability("resize", "Resize to {width} wide, crop {crop}"), map[string]any{"width": 1.5, "crop": true}, nil,
			"Resize to 1.5 wide, crop true"},
		{"a field used twice", capability("copy", "Copy {src} onto {src}"), map[string]any{"src": "h_1"}, map[string]string{"src": "a.md"},
			`Copy "a.md" onto "a.md"`},
		{"no template, no fields", capability("ping", ""), map[string]any{}, nil, "Ping"},
		{"no name", capability("", ""), map[string]any{}, nil, "Unnamed capability"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := summarize(tc.capability, tc.args, tc.labels); got != tc.want {
				t.Errorf("summarize = %q, want %q", got, tc.want)
			}
		})
	}
}
