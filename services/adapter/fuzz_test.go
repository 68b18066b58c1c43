package adapter

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// FuzzIncomingMessage feeds arbitrary server output through the stdio
// per-message limiter and then through the conversion of results into
// content items. Invariants: what the limiter passes is a prefix of the
// input with no message longer than the limit; a refusal happens only for
// input that has such a message; conversion never panics and what it
// accepts respects the limits.
func FuzzIncomingMessage(f *testing.F) {
	seeds := []string{
		`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hello"}]}}` + "\n",
		`{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"image","mimeType":"image/png","data":"iVBORw0KGgo="}]}}` + "\n",
		`{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"resource","resource":{"uri":"v0m3://notes/a","mimeType":"text/markdown","text":"# A","_meta":{"revision":1}}}]}}` + "\n",
		`{"jsonrpc":"2.0","id":4,"result":{"contents":[{"uri":"demo://x","blob":"AAEC"}]}}` + "\n",
		`{"jsonrpc":"2.0","id":5,"result":{"content":[{"type":"resource_link","uri":"file:///etc/passwd","name":"p"}],"structuredContent":{"a":[1,2]}}}` + "\n",
		`{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}` + "\n" + `{"jsonrpc":"2.0","id":6,"error":{"code":-32602,"message":"bad"}}` + "\n",
		"this is not JSON-RPC {\"jsonrpc\":\n",
		`{"jsonrpc":"2.0","id":7,"result":{"content":"not a list"}}`,
		strings.Repeat("x", 5000) + "\n",
		"\n\n\n",
		`{"jsonrpc":"2.0","id":8,"result":{"content":[{"type":"text","text":"\ud800 invalid \xff"}]}}` + "\n",
	}
	for i, s := range seeds {
		f.Add([]byte(s), uint16(64+i*200))
	}
	f.Fuzz(func(t *testing.T, data []byte, limit uint16) {
		lim := int64(limit%4096) + 1
		m := newMeter(lim)
		r := &lineLimitReader{r: io.NopCloser(bytes.NewReader(data)), m: m}
		var got []byte
		buf := make([]byte, 7) // small reads exercise message boundaries across reads
		var err error
		for {
			var n int
			n, err = r.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				break
			}
		}
		if !bytes.HasPrefix(data, got) {
			t.Fatalf("the limiter passed bytes that are not a prefix of the input")
		}
		longest := 0
		for _, line := range bytes.Split(data, []byte("\n")) {
			longest = max(longest, len(line))
		}
		for _, line := range bytes.Split(got, []byte("\n")) {
			if int64(len(line)) > lim {
				t.Fatalf("a %d-byte message passed a %d-byte limit", len(line), lim)
			}
		}
		var le *LimitError
		switch {
		case errors.As(err, &le):
			if int64(longest) <= lim || !m.exceeded.Load() {
				t.Fatalf("refused input whose longest message is %d bytes under a %d-byte limit", longest, lim)
			}
		case errors.Is(err, io.EOF):
			if int64(longest) > lim {
				t.Fatalf("passed a %d-byte message under a %d-byte limit", longest, lim)
			}
		default:
			t.Fatalf("unexpected error %v", err)
		}

		limits := &registryv1.Limits{MaxResponseBytes: 1 << 10, MaxItems: 4, AllowedMediaTypes: []string{"text/plain", "text/markdown", "image/png", "application/octet-stream", "text/uri-list"}}
		for _, line := range bytes.Split(got, []byte("\n")) {
			var msg struct {
				Result json.RawMessage `json:"result"`
			}
			if json.Unmarshal(line, &msg) != nil || msg.Result == nil {
				continue
			}
			var tr mcp.CallToolResult
			if json.Unmarshal(msg.Result, &tr) == nil {
				checkResult(t, limits)(fromToolResult(&tr, limits, nil))
			}
			var rr mcp.ReadResourceResult
			if json.Unmarshal(msg.Result, &rr) == nil {
				checkResult(t, limits)(fromReadResult(&rr, limits))
			}
		}
	})
}

func checkResult(t *testing.T, l *registryv1.Limits) func(result, error) {
	return func(r result, err error) {
		t.Helper()
		if err != nil {
			return
		}
		if len(r.items) > int(l.GetMaxItems()) {
			t.Fatalf("%d items accepted under max_items=%d", len(r.items), l.GetMaxItems())
		}
		var size int64
		for _, it := range r.items {
			size += int64(len(it.GetText())) + it.GetBlobSize()
			if !strings.HasPrefix(it.GetContentDigest(), "sha256:") || len(it.GetMetadata()) > maxMetaKeys {
				t.Fatalf("item %v", it)
			}
		}
		if size > l.GetMaxResponseBytes() || !strings.HasPrefix(r.digest, "sha256:") {
			t.Fatalf("accepted %d content bytes under max_response_bytes=%d (digest %q)", size, l.GetMaxResponseBytes(), r.digest)
		}
	}
}
