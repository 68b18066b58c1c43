package orchestrator

import (
	"slices"
	"testing"
)

func TestSplitPassages(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		text string
		want []string
	}{
		{"empty", "", nil},
		{"only blank lines", "\n \n\t\n", nil},
		{"one paragraph keeps its lines", "line one\nline two", []string{"line one\nline two"}},
		{"blank lines split", "a\n\nb\n\n\nc", []string{"a", "b", "c"}},
		{"whitespace-only line is blank", "a\n   \nb", []string{"a", "b"}},
		{"CRLF", "a\r\n\r\nb\r\n", []string{"a", "b"}},
		{"leading and trailing space trimmed", "\n\n  a  \n\n", []string{"a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ps := splitPassages(tc.text)
			var texts []string
			for i, p := range ps {
				texts = append(texts, p.GetText())
				if want := "p" + string(rune('1'+i)); p.GetPassageId() != want || int(p.GetIndex()) != i {
					t.Errorf("passage %d id %q index %d", i, p.GetPassageId(), p.GetIndex())
				}
			}
			if !slices.Equal(texts, tc.want) {
				t.Errorf("passages = %q, want %q", texts, tc.want)
			}
		})
	}
}

func TestTruncateKeepsUTF8(t *testing.T) {
	t.Parallel()
	if got := truncate("héllo", 2); got != "h" {
		t.Errorf("truncate = %q", got)
	}
	if got := truncate("abc", 5); got != "abc" {
		t.Errorf("truncate = %q", got)
	}
}
