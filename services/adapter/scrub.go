package adapter

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// RedactedCredential replaces a resolved credential wherever a server
// echoed it.
const RedactedCredential = "[REDACTED credential]"

// minEncodedForm is the shortest encoded form (base64, hex, percent
// encoding) of a credential that is scrubbed: shorter fragments would
// match unrelated text. The raw value is always scrubbed.
const minEncodedForm = 8

// credentials are the credential values resolved for one session (and its
// connect retries). Every remote value the session hands out is scrubbed
// of them (see remote.go), so nothing derived from remote text, whether
// results, structured content, error text, snapshots, traces, fixtures or
// logs, can carry a credential out of the adapter.
type credentials struct {
	// roots and connectionID say where the connection's credentials may
	// be read (see credentialRoots.read).
	roots        credentialRoots
	connectionID string

	mu sync.Mutex
	// forms are each value and its encodings, longest first.
	forms []string
	// jsonForms are the forms as they appear inside encoded JSON strings.
	jsonForms [][]byte
}

// read resolves a credential reference of the connection (see
// credentialRoots.read) without remembering it.
func (c *credentials) read(ref string) (string, error) {
	return c.roots.read(c.connectionID, ref)
}

// resolve reads a credential reference of the connection and remembers
// the value for scrubbing.
func (c *credentials) resolve(ref string) (string, error) {
	v, err := c.read(ref)
	if err == nil && v != "" {
		c.add(v)
	}
	return v, err
}

// add remembers a credential value and the encodings a server might echo
// it in: raw (also inside "Bearer ..."), base64 (standard and URL
// alphabets, at any alignment inside a longer encoded text, as in
// "Basic base64(user:secret)"), hex, and percent-encoded.
func (c *credentials) add(v string) {
	forms := []string{v}
	enc := func(s string) {
		if len(s) >= minEncodedForm && s != v {
			forms = append(forms, s)
		}
	}
	for _, e := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		enc(e.EncodeToString([]byte(v)))
		for align := range 3 {
			enc(base64Core(e, v, align))
		}
	}
	enc(hex.EncodeToString([]byte(v)))
	enc(strings.ToUpper(hex.EncodeToString([]byte(v))))
	enc(url.QueryEscape(v))
	enc(url.PathEscape(v))

	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range forms {
		if slices.Contains(c.forms, f) {
			continue
		}
		c.forms = append(c.forms, f)
		j, _ := json.Marshal(f)
		c.jsonForms = append(c.jsonForms, j[1:len(j)-1])
	}
	// Longest first, so a form containing another is replaced whole.
	slices.SortStableFunc(c.forms, func(a, b string) int { return len(b) - len(a) })
	slices.SortStableFunc(c.jsonForms, func(a, b []byte) int { return len(b) - len(a) })
}

// base64Core is the part of the base64 encoding of v, when v starts align
// bytes into a longer text, that depends on v's bytes alone: it appears in
// the encoding of any text with v at such an offset.
func base64Core(e *base64.Encoding, v string, align int) string {
	s := e.EncodeToString(append(make([]byte, align), v...))
	first := (8*align + 5) / 6         // first character whose 6 bits are all v's
	last := (8 * (align + len(v))) / 6 // one past the last such character
	if first >= last || last > len(s) {
		return ""
	}
	return s[first:last]
}

// none reports whether no credential was resolved.
func (c *credentials) none() bool {
	if c == nil {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.forms) == 0
}

// text returns s with every credential form replaced.
func (c *credentials) text(s string) string {
	if c.none() {
		return s
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.forms {
		s = strings.ReplaceAll(s, f, RedactedCredential)
	}
	return s
}

// jsonText returns encoded JSON with every credential form inside its
// strings replaced.
func (c *credentials) jsonText(b []byte) []byte {
	if c.none() {
		return b
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.jsonForms {
		b = bytes.ReplaceAll(b, f, []byte(RedactedCredential))
	}
	return b
}

// inJSON reports whether encoded JSON holds a credential form in any of
// its strings. Encoders escape character by character, so a string holding
// a form holds its escaped form.
func (c *credentials) inJSON(b []byte) bool {
	if c.none() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.jsonForms {
		if bytes.Contains(b, f) {
			return true
		}
	}
	return false
}

// scrubJSON returns v, or when it holds a credential, a copy of it with
// every string (values and object keys, at any depth) scrubbed. v must
// round-trip through encoding/json, as every MCP type does. On error the
// zero value is returned: an unscrubbed value is never handed out.
func scrubJSON[T any](c *credentials, v T) (T, error) {
	var zero T
	if c.none() {
		return v, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return zero, err
	}
	if !c.inJSON(raw) {
		return v, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return zero, err
	}
	if raw, err = json.Marshal(c.tree(tree)); err != nil {
		return zero, err
	}
	var out T
	if err := json.Unmarshal(raw, &out); err != nil {
		return zero, err
	}
	return out, nil
}

// tree scrubs a decoded JSON value.
func (c *credentials) tree(v any) any {
	switch v := v.(type) {
	case string:
		return c.text(v)
	case []any:
		for i := range v {
			v[i] = c.tree(v[i])
		}
		return v
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[c.text(k)] = c.tree(e)
		}
		return out
	}
	return v
}

// scrubbedError is a remote-derived error with every credential removed
// from its text. It still matches its cause's types (errors.As), except
// that a JSON-RPC error is found as a scrubbed copy.
type scrubbedError struct {
	msg   string
	wire  *jsonrpc.Error
	cause error
}

func (e *scrubbedError) Error() string { return e.msg }

func (e *scrubbedError) Unwrap() []error {
	if e.wire != nil {
		return []error{e.wire, e.cause}
	}
	return []error{e.cause}
}

// err returns err with every credential removed from its text, and from
// the message and data of a JSON-RPC error inside it.
func (c *credentials) err(err error) error {
	if err == nil || c.none() {
		return err
	}
	se := &scrubbedError{msg: c.text(err.Error()), cause: err}
	var w *jsonrpc.Error
	if errors.As(err, &w) {
		se.wire = &jsonrpc.Error{Code: w.Code, Message: c.text(w.Message)}
		if len(w.Data) > 0 {
			se.wire.Data = c.jsonText(w.Data)
		}
	}
	return se
}
