package adapter

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/v0m3/v0m3/demo/fixture"
)

// scrubSecret is a credential with both cases, digits and the characters
// that differ between base64 alphabets.
const scrubSecret = "Vm3_Tok-9fQxZ2pLr8KwYt4NcB7hJd"

// survivors returns the pieces (windows of n characters, whitespace and
// format characters removed) of payload that are still in out.
func survivors(payload, out string, n int) []string {
	payload, out = strings.ToLower(payload), strings.ToLower(out)
	clean := func(s string) string {
		return strings.Map(func(r rune) rune {
			if unicode.IsSpace(r) || unicode.Is(unicode.Cf, r) {
				return -1
			}
			return r
		}, s)
	}
	p, o := clean(payload), clean(out)
	var found []string
	for i := 0; i+n <= len(p); i++ {
		if strings.Contains(o, p[i:i+n]) {
			found = append(found, p[i:i+n])
		}
	}
	return found
}

// TestScrubNormalizesForms: each form a server can change a credential
// into while keeping it readable is scrubbed from text, whole, leaving
// no piece of it.
func TestScrubNormalizesForms(t *testing.T) {
	t.Parallel()
	c := &credentials{}
	c.add(scrubSecret)
	const v = scrubSecret
	for _, tc := range []struct{ name, payload string }{
		{"upper-cased", strings.ToUpper(v)},
		{"lower-cased", strings.ToLower(v)},
		{"percent-encoded, lower-case hex", fixture.EchoForm("percent_lower", v)},
		{"percent-encoded, upper-case hex", fixture.EchoForm("percent_upper", v)},
		{"percent-encoded, mixed", strings.ToUpper(v[:10]) + fixture.EchoForm("percent_lower", v[10:20]) + v[20:]},
		{"base32", base32.StdEncoding.EncodeToString([]byte(v))},
		{"base32, lower-case, no padding", fixture.EchoForm("base32_lower_nopad", v)},
		{"base32 at an offset", base32.StdEncoding.EncodeToString([]byte("user:" + v))},
		{"base64, MIME-wrapped", fixture.EchoForm("mime", v)},
		{"base64, URL alphabet, wrapped", fixture.EchoForm("base64url_wrapped", v)},
		{"base64, spaces inside", fixture.EchoForm("spaced", base64.StdEncoding.EncodeToString([]byte(v)))},
		{"hex, upper-case, wrapped", fixture.EchoForm("spaced", strings.ToUpper(hex.EncodeToString([]byte(v))))},
		{"zero-width spaces", fixture.EchoForm("zero_width", v)},
		{"joiners, soft hyphens and a byte order mark", "\ufeff" + v[:5] + "\u200d" + v[5:11] + "\u00ad" + v[11:19] + "\u2060" + v[19:]},
		{"whitespace", fixture.EchoForm("spaced", v)},
		{"line breaks", v[:7] + "\r\n" + v[7:15] + "\n" + v[15:]},
		{"no-break and ideographic spaces", v[:9] + "\u00a0" + v[9:20] + "\u3000" + v[20:]},
		{"percent-encoded zero-width space", v[:12] + "%E2%80%8B" + v[12:]},
		{"half (a prefix left by a cut)", v[:15]},
		{"the second half", v[15:]},
		{"a piece from the middle", v[6:18]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := "before " + tc.payload + " after"
			got := c.text(in)
			if !strings.Contains(got, RedactedCredential) {
				t.Fatalf("text(%q) = %q, want the credential replaced", in, got)
			}
			if !strings.HasPrefix(got, "before ") || !strings.HasSuffix(got, " after") {
				t.Errorf("text(%q) = %q, want the text around the credential kept", in, got)
			}
			if s := survivors(tc.payload, got, 10); len(s) > 0 {
				t.Errorf("text(%q) = %q still holds %q", in, got, s)
			}
		})
	}
}

// TestScrubAcrossItems: a credential cut in two, one half in each of two
// places of one call's answer, is scrubbed in both.
func TestScrubAcrossItems(t *testing.T) {
	t.Parallel()
	c := &credentials{}
	c.add(scrubSecret)
	first, second := scrubSecret[:len(scrubSecret)/2], scrubSecret[len(scrubSecret)/2:]
	for _, tc := range []struct {
		name string
		res  *mcp.CallToolResult
	}{
		{"two text items", &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "a " + first}, &mcp.TextContent{Text: second + " b"}}}},
		{"text and structured content", &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: first}}, StructuredContent: map[string]any{"rest": second}}},
		{"a tool error's items", &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: first}, &mcp.TextContent{Text: second}}}},
		{"text and an embedded resource's URI", &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: first},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "notes://x?t=" + strings.ToLower(second), Text: "x"}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := scrubJSON(c, tc.res)
			if err != nil {
				t.Fatal(err)
			}
			raw := mustJSON(t, out)
			for _, half := range []string{first, second} {
				if s := survivors(half, raw, 8); len(s) > 0 {
					t.Errorf("%s still holds %q", raw, s)
				}
			}
			if !strings.Contains(raw, RedactedCredential) {
				t.Errorf("%s: no marker", raw)
			}
		})
	}

	// A JSON-RPC error whose message has one half and its data the other.
	err := c.err(&jsonrpc.Error{Code: -32001, Message: "rejected " + first, Data: []byte(`{"rest":"` + second + `"}`)})
	var w *jsonrpc.Error
	if !errors.As(err, &w) {
		t.Fatalf("the scrubbed error is no JSON-RPC error: %v", err)
	}
	for _, s := range []string{err.Error(), w.Message, string(w.Data)} {
		for _, half := range []string{first, second} {
			if strings.Contains(s, half) {
				t.Errorf("the error still holds %q: %s", half, s)
			}
		}
	}
}

// TestScrubKeepsUnrelatedText: text without the credential is returned
// as it was, including digests, encodings of other values and pieces of
// the credential too short to be told from chance.
func TestScrubKeepsUnrelatedText(t *testing.T) {
	t.Parallel()
	c := &credentials{}
	c.add(scrubSecret)
	other := make([]byte, 64)
	_, _ = rand.Read(other)
	sum := sha256.Sum256([]byte(scrubSecret))
	for _, in := range []string{
		"The quick brown fox jumps over the lazy dog. Ünïcödé, %zz, %4, \\u00zz, tabs\tand\nlines.",
		hex.EncodeToString(other) + " " + base64.StdEncoding.EncodeToString(other) + " " + base32.StdEncoding.EncodeToString(other),
		"sha256:" + hex.EncodeToString(sum[:]), // a digest of the credential is not the credential
		"short piece: " + scrubSecret[3:10],
		"",
	} {
		if got := c.text(in); got != in {
			t.Errorf("text(%q) = %q, want it unchanged", in, got)
		}
	}
}

// TestScrubShortCredential: a credential shorter than a piece is still
// scrubbed whole, in any case.
func TestScrubShortCredential(t *testing.T) {
	t.Parallel()
	c := &credentials{}
	c.add("Pin42")
	if got := c.text("pin is PIN42, p i n 4 2"); got != "pin is "+RedactedCredential+", "+RedactedCredential {
		t.Errorf("got %q", got)
	}
}

// TestScrubJSONEscapes: encoded JSON is checked with its escapes decoded.
func TestScrubJSONEscapes(t *testing.T) {
	t.Parallel()
	c := &credentials{}
	c.add(scrubSecret)
	for _, raw := range []string{
		`{"a":"` + scrubSecret[:7] + `\n` + scrubSecret[7:14] + `\t` + scrubSecret[14:21] + `\r` + scrubSecret[21:] + `"}`,
		`{"a":"` + strings.ReplaceAll(fixture.EchoForm("zero_width", scrubSecret), "\u200b", `\u200b`) + `"}`,
		`{"a":"` + escapeEvery(scrubSecret, 4) + `"}`,
	} {
		if !c.inJSON([]byte(raw)) {
			t.Errorf("inJSON(%s) = false", raw)
		}
		if out := string(c.jsonText([]byte(raw))); !strings.Contains(out, RedactedCredential) || strings.Contains(out, scrubSecret[:7]) {
			t.Errorf("jsonText(%s) = %s", raw, out)
		}
	}
}

// escapeEvery writes every n-th character of s as a JSON \u escape.
func escapeEvery(s string, n int) string {
	var b strings.Builder
	for i := range len(s) {
		if i%n == n-1 {
			fmt.Fprintf(&b, `\u%04x`, s[i])
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// FuzzScrub: no text makes the scrubber fail, and what it returns never
// holds the credential, in any case, with its invisible characters
// removed.
func FuzzScrub(f *testing.F) {
	c := &credentials{}
	c.add(scrubSecret)
	for _, s := range []string{"", "%", "%e2%80", "%E2%80%8", "\\u00", scrubSecret, "x" + fixture.EchoForm("percent_lower", scrubSecret),
		fixture.EchoForm("mime", scrubSecret), fixture.EchoForm("zero_width", scrubSecret), "\xff\xfe" + scrubSecret[:9]} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out := c.text(in)
		if s := survivors(scrubSecret, strings.ToLower(out), 10); len(s) > 0 && len(survivors(scrubSecret, strings.ToLower(in), 10)) > 0 {
			t.Errorf("text(%q) = %q holds %q", in, out, s)
		}
		_ = c.inJSON([]byte(in))
	})
}
