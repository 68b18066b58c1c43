package summary

import (
	"slices"
	"testing"
)

func TestFields(t *testing.T) {
	t.Parallel()
	tests := []struct {
		tmpl    string
		want    []string
		wantErr bool
	}{
		{"Render preview of document revision {document_revision} using profile {profile}", []string{"document_revision", "profile"}, false},
		{"Deliver {artifact} and {artifact} again", []string{"artifact"}, false},
		{"Literal {{braces}} only", nil, false},
		{"", nil, false},
		{"Unclosed {query", nil, true},
		{"Stray } brace", nil, true},
		{"Empty {} placeholder", nil, true},
		{"Not a name {query text}", nil, true},
		{"Starts with a digit {1st}", nil, true},
		{"Nested {{query}", nil, true},
	}
	for _, tc := range tests {
		got, err := Fields(tc.tmpl)
		if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
			t.Errorf("Fields(%q) = %v, %v; want %v, error %v", tc.tmpl, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestRender(t *testing.T) {
	t.Parallel()
	values := map[string]string{"query": `"migration"`, "source": `"Migration FAQ"`}
	value := func(f string) (string, bool) { v, ok := values[f]; return v, ok }
	got, ok := Render("Retrieve passages about {query} from source {source} {{verbatim}}", value)
	if want := `Retrieve passages about "migration" from source "Migration FAQ" {verbatim}`; !ok || got != want {
		t.Errorf("Render = %q, %v; want %q", got, ok, want)
	}
	if _, ok := Render("Deliver {artifact}", value); ok {
		t.Error("a placeholder without a value rendered")
	}
	if _, ok := Render("Broken {query", value); ok {
		t.Error("a template that does not parse rendered")
	}
}
