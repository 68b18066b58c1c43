package adapter

import (
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkScrub measures the scrubber on every call's hot path: text and
// a tool result of 64 KiB, without the credential (the usual case) and
// with it echoed once.
func BenchmarkScrub(b *testing.B) {
	c := &credentials{}
	c.add(scrubSecret)
	prose := strings.Repeat("The server answered with 42 results; see https://example.com/a?b=c&d=%20e for more.\n", 800)[:64<<10]
	echo := prose[:32<<10] + " token " + scrubSecret + " " + prose[32<<10:]
	result := func(s string) *mcp.CallToolResult {
		r := &mcp.CallToolResult{}
		for i := 0; i < len(s); i += 4 << 10 {
			r.Content = append(r.Content, &mcp.TextContent{Text: s[i:min(i+4<<10, len(s))]})
		}
		return r
	}
	for _, tc := range []struct {
		name string
		text string
	}{{"clean", prose}, {"echo", echo}} {
		b.Run("text/"+tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.text)))
			for b.Loop() {
				_ = c.text(tc.text)
			}
		})
		b.Run("result/"+tc.name, func(b *testing.B) {
			r := result(tc.text)
			b.SetBytes(int64(len(tc.text)))
			for b.Loop() {
				if _, err := scrubJSON(c, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
