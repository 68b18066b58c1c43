// Package summary owns the syntax of a capability's summary template: how
// a request reads on an approval page, in product terms, e.g. "Render
// preview of document revision {document_revision} using profile
// {profile}". The registry checks a template when a capability is
// declared; whoever phrases a request renders it with the same parser.
//
// A placeholder is "{field}", field a product field name (letters,
// digits, underscores, not starting with a digit). "{{" and "}}" stand
// for literal braces; any other brace is an error. How a value is written
// is the renderer's choice; the seed's phrases quote strings and handle
// labels (as %q does) and write numbers plainly, e.g. `Retrieve passages
// about "migration" from source "Migration FAQ"`.
package summary

import (
	"fmt"
	"strings"
)

// Part is one piece of a parsed template: literal text or a placeholder.
type Part struct {
	// Text is literal text; empty for a placeholder.
	Text string
	// Field names the product field of a placeholder; empty for text.
	Field string
}

// Parse splits tmpl into literal text and placeholders.
func Parse(tmpl string) ([]Part, error) {
	var parts []Part
	var text strings.Builder
	flush := func() {
		if text.Len() > 0 {
			parts = append(parts, Part{Text: text.String()})
			text.Reset()
		}
	}
	for i := 0; i < len(tmpl); i++ {
		switch c := tmpl[i]; {
		case c == '{' && strings.HasPrefix(tmpl[i:], "{{"):
			text.WriteByte('{')
			i++
		case c == '}' && strings.HasPrefix(tmpl[i:], "}}"):
			text.WriteByte('}')
			i++
		case c == '{':
			end := strings.IndexByte(tmpl[i:], '}')
			if end < 0 {
				return nil, fmt.Errorf("placeholder at offset %d is not closed with }", i)
			}
			field := tmpl[i+1 : i+end]
			if !isField(field) {
				return nil, fmt.Errorf("placeholder {%s} at offset %d is not a field name (letters, digits and _; write {{ or }} for a literal brace)", field, i)
			}
			flush()
			parts = append(parts, Part{Field: field})
			i += end
		case c == '}':
			return nil, fmt.Errorf("unmatched } at offset %d (write }} for a literal brace)", i)
		default:
			text.WriteByte(c)
		}
	}
	flush()
	return parts, nil
}

// Fields returns the field names tmpl's placeholders name, in order of
// first appearance.
func Fields(tmpl string) ([]string, error) {
	parts, err := Parse(tmpl)
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, p := range parts {
		if p.Field != "" && !seen[p.Field] {
			seen[p.Field] = true
			out = append(out, p.Field)
		}
	}
	return out, nil
}

// Render fills tmpl's placeholders with value(field). It reports false
// when tmpl does not parse or a field has no value, so the caller can
// phrase the request another way.
func Render(tmpl string, value func(field string) (string, bool)) (string, bool) {
	parts, err := Parse(tmpl)
	if err != nil {
		return "", false
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Field == "" {
			b.WriteString(p.Text)
			continue
		}
		v, ok := value(p.Field)
		if !ok {
			return "", false
		}
		b.WriteString(v)
	}
	return b.String(), true
}

func isField(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		switch {
		case c == '_', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
