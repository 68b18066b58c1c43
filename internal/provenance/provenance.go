// Package provenance owns how a tool result is attributed when it becomes
// evidence: which source a passage came from (a mapping's declared
// provenance), and the identity of data a tool returned. The registry
// checks a declared provenance with it, the orchestrator applies it to
// results, and evidence refuses a source that takes a data identity.
package provenance

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/go-openapi/jsonpointer"

	"github.com/v0m3/v0m3/internal/digest"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// DataScheme is the URI scheme of tool-data identities. It is V0M3's own:
// no server names a source with it, so a source can never be taken for a
// call's data nor take over a data identity's revisions.
const DataScheme = "v0m3-data"

// IsDataURI reports whether uri is a tool-data identity (scheme compared
// without case, as URI schemes are).
func IsDataURI(uri string) bool {
	scheme, _, ok := strings.Cut(uri, ":")
	return ok && strings.EqualFold(strings.TrimSpace(scheme), DataScheme)
}

// DataURI names the data a tool returned for one call: the connection, the
// tool and the digest of the remote arguments. The same call on the same
// connection always has the same identity, so a new answer to it is a new
// revision of the same data, as a new content digest of a source is. The
// arguments appear only as a digest: they may carry handle targets,
// server-side values the identity must not spell out. Nothing in it is a
// location a model could be sent to.
func DataURI(connectionID, tool string, arguments map[string]any) (string, error) {
	if arguments == nil {
		arguments = map[string]any{}
	}
	d, err := digest.JSON(arguments)
	if err != nil {
		return "", fmt.Errorf("provenance: digest arguments: %w", err)
	}
	return DataScheme + ":" + url.PathEscape(connectionID) + "/tools/" + url.PathEscape(tool) + "/calls/" + strings.TrimPrefix(d, "sha256:"), nil
}

// ResultKind is what a capability's successful result becomes: the
// declared kind, or the one its effect class implies.
func ResultKind(c *registryv1.Capability) registryv1.ResultKind {
	if k := c.GetResultKind(); k != registryv1.ResultKind_RESULT_KIND_UNSPECIFIED {
		return k
	}
	switch c.GetEffectClass() {
	case registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL:
		return registryv1.ResultKind_RESULT_KIND_SOURCE_OBSERVATION
	case registryv1.EffectClass_EFFECT_CLASS_LOCAL_TRANSFORMATION:
		return registryv1.ResultKind_RESULT_KIND_ARTIFACT
	case registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT:
		return registryv1.ResultKind_RESULT_KIND_RECEIPT
	}
	return registryv1.ResultKind_RESULT_KIND_UNSPECIFIED
}

// Mode is a provenance's mode, CONTENT_URI when not set.
func Mode(p *registryv1.Provenance) registryv1.ProvenanceMode {
	if m := p.GetMode(); m != registryv1.ProvenanceMode_PROVENANCE_MODE_UNSPECIFIED {
		return m
	}
	return registryv1.ProvenanceMode_PROVENANCE_MODE_CONTENT_URI
}

// badEscape matches a "~" that is not the escape ~0 or ~1.
var badEscape = regexp.MustCompile(`~([^01]|$)`)

// maxPointerTokens bounds a pointer's depth: a reviewer reads it, and the
// structured content it walks is bounded anyway.
const maxPointerTokens = 32

// ParsePointer parses a JSON Pointer (RFC 6901) that names a value inside
// the structured content: "" (the whole content) is refused, since the
// content is an object and a URI is a string.
func ParsePointer(ptr string) ([]string, error) {
	if ptr == "" {
		return nil, errors.New(`the pointer is empty; name a string inside the structured content, e.g. "/uri"`)
	}
	p, err := jsonpointer.New(ptr)
	if err != nil {
		return nil, fmt.Errorf("not a JSON Pointer (RFC 6901): %w", err)
	}
	if badEscape.MatchString(ptr) {
		// The library decodes what it can; RFC 6901 allows only ~0 and ~1.
		return nil, errors.New(`not a JSON Pointer (RFC 6901): "~" must be followed by 0 or 1`)
	}
	tokens := p.DecodedTokens()
	if len(tokens) > maxPointerTokens {
		return nil, fmt.Errorf("the pointer has %d segments, more than %d", len(tokens), maxPointerTokens)
	}
	return tokens, nil
}

// StringAt returns the string the pointer names in doc (JSON values as
// encoding/json or structpb produce them), or an error saying what is
// there instead. The error never quotes the value: it is remote content.
func StringAt(doc map[string]any, ptr string) (string, error) {
	tokens, err := ParsePointer(ptr)
	if err != nil {
		return "", err
	}
	var cur any = doc
	for i, tok := range tokens {
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[tok]
			if !ok {
				return "", fmt.Errorf("no member %q at %s", tok, Pointer(tokens[:i]))
			}
			cur = next
		case []any:
			n, err := index(tok)
			if err != nil || n >= len(v) {
				return "", fmt.Errorf("no element %q at %s", tok, Pointer(tokens[:i]))
			}
			cur = v[n]
		default:
			return "", fmt.Errorf("%s is not an object or array", Pointer(tokens[:i]))
		}
	}
	s, ok := cur.(string)
	if !ok {
		return "", fmt.Errorf("%s is not a string", ptr)
	}
	return s, nil
}

// Pointer spells tokens as a JSON Pointer.
func Pointer(tokens []string) string {
	if len(tokens) == 0 {
		return `"" (the root)`
	}
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(jsonpointer.Escape(t))
	}
	return b.String()
}

// index parses an array index token: digits only, no leading zero.
func index(tok string) (int, error) {
	if tok == "" || (len(tok) > 1 && tok[0] == '0') || strings.TrimLeft(tok, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not an array index", tok)
	}
	return strconv.Atoi(tok)
}

// maxRefs bounds the local references followed while walking a schema, so
// a reference cycle ends.
const maxRefs = 64

// CheckPointerInSchema checks that ptr names a place the JSON Schema
// schema (an output schema as observed) describes and that may hold a
// string: each segment must be a declared property of an object or an
// index of an array, following local "$ref"s ("#/..."). What cannot be
// followed (a remote reference, a property the schema leaves open) is
// refused: a reviewer must see where the URI comes from.
func CheckPointerInSchema(schema map[string]any, ptr string) error {
	tokens, err := ParsePointer(ptr)
	if err != nil {
		return err
	}
	refs := 0
	deref := func(s map[string]any) (map[string]any, error) {
		for {
			ref, ok := s["$ref"].(string)
			if !ok {
				return s, nil
			}
			if refs++; refs > maxRefs {
				return nil, errors.New("the schema's references do not end")
			}
			local, ok := strings.CutPrefix(ref, "#")
			if !ok {
				return nil, fmt.Errorf("the schema refers to %q, outside itself", ref)
			}
			target := any(schema)
			if local != "" {
				p, err := jsonpointer.New(local)
				if err != nil {
					return nil, fmt.Errorf("the schema's reference %q is not a JSON Pointer: %w", ref, err)
				}
				if target, _, err = p.Get(schema); err != nil {
					return nil, fmt.Errorf("the schema's reference %q does not resolve", ref)
				}
			}
			next, ok := target.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("the schema's reference %q is not a schema", ref)
			}
			s = next
		}
	}
	cur, err := deref(schema)
	if err != nil {
		return err
	}
	for i, tok := range tokens {
		at := Pointer(tokens[:i+1])
		var next map[string]any
		if props, ok := cur["properties"].(map[string]any); ok {
			next, _ = props[tok].(map[string]any)
		}
		if next == nil && allows(cur, "array") {
			n, err := index(tok)
			if err == nil {
				if prefix, ok := cur["prefixItems"].([]any); ok && n < len(prefix) {
					next, _ = prefix[n].(map[string]any)
				} else {
					next, _ = cur["items"].(map[string]any)
				}
			}
		}
		if next == nil {
			return fmt.Errorf("the output schema declares nothing at %s", at)
		}
		if cur, err = deref(next); err != nil {
			return err
		}
	}
	if !allows(cur, "string") {
		return fmt.Errorf("the output schema says %s is not a string", ptr)
	}
	return nil
}

// allows reports whether a schema's "type" admits want (no "type" admits
// everything).
func allows(s map[string]any, want string) bool {
	switch t := s["type"].(type) {
	case nil:
		return true
	case string:
		return t == want
	case []any:
		return slices.Contains(t, any(want))
	}
	return false
}
