package adapter

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// RedactedCredential replaces a resolved credential wherever a server
// echoed it.
const RedactedCredential = "[REDACTED credential]"

// credentials are the credential values resolved for one session (and its
// connect retries). Every remote value the session hands out is scrubbed
// of them (see remote.go), so nothing derived from remote text, whether
// results, structured content, error text, snapshots, traces, fixtures or
// logs, can carry a credential out of the adapter. Matching normalizes
// case and encoding and finds pieces of a credential (scrubmatch.go).
type credentials struct {
	// roots and connectionID say where the connection's credentials may
	// be read (see credentialRoots.read).
	roots        credentialRoots
	connectionID string

	mu     sync.Mutex // serializes add
	values []string
	// m matches every value's forms; it is rebuilt when a value is added
	// (once per credential, not per call) and read without a lock.
	m atomic.Pointer[matcher]
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

// add remembers a credential value and computes the forms a server might
// echo it in (see newMatcher).
func (c *credentials) add(v string) {
	if v == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if slices.Contains(c.values, v) {
		return
	}
	c.values = append(c.values, v)
	c.m.Store(newMatcher(c.values))
}

// matcher is the current matcher, nil when no credential was resolved.
func (c *credentials) matcher() *matcher {
	if c == nil {
		return nil
	}
	return c.m.Load()
}

// none reports whether no credential was resolved.
func (c *credentials) none() bool { return c.matcher() == nil }

// text returns s with every credential form replaced.
func (c *credentials) text(s string) string {
	m := c.matcher()
	if m == nil {
		return s
	}
	return m.scrub(s)
}

// jsonText returns encoded JSON with every credential form inside its
// strings replaced. JSON that does not decode is scrubbed as text.
func (c *credentials) jsonText(b []byte) []byte {
	if !c.inJSON(b) {
		return b
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err == nil {
		if out, err := json.Marshal(c.tree(tree)); err == nil {
			return out
		}
	}
	return []byte(c.text(string(b)))
}

// inJSON reports whether encoded JSON holds a credential form in any of
// its strings (its escapes decoded).
func (c *credentials) inJSON(b []byte) bool {
	m := c.matcher()
	return m != nil && m.contains(string(b), true)
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
