// Package argmap owns the paths of a mapping's argument map: how a binding
// names a place in the remote (or product) arguments, how a value is put
// there when a call's arguments are built, and how a path is checked
// against a JSON Schema when a mapping is reviewed. The registry checks
// and the orchestrator builds with the same rules, so a map that passed
// review builds the arguments review saw.
//
// A path is a top-level name ("query") or an RFC 6901 JSON Pointer
// ("/options/depth", "/paths/0", "/paths/-"). After the first token, a
// decimal token or "-" addresses an array element and any other token an
// object field; the first token always names a top-level field, because
// arguments are an object.
package argmap

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Append is the token that appends one element to an array.
const Append = "-"

// Path is a parsed path: its reference tokens, unescaped.
type Path []string

// Parse parses a binding's field: a top-level name, or a JSON Pointer when
// it starts with "/". It refuses what cannot be built unambiguously: an
// empty path or token, a bad "~" escape, an index with leading zeros, and
// "-" anywhere but last (each "-" appends a new element, so a field of an
// appended object would land in another element than its siblings).
func Parse(field string) (Path, error) {
	if field == "" {
		return nil, errors.New("the path is empty")
	}
	if !strings.HasPrefix(field, "/") {
		return Path{field}, nil
	}
	raw := strings.Split(field[1:], "/")
	p := make(Path, 0, len(raw))
	for i, tok := range raw {
		t, err := unescape(tok)
		if err != nil {
			return nil, fmt.Errorf("token %d of %q: %w", i+1, field, err)
		}
		if t == "" {
			return nil, fmt.Errorf("token %d of %q is empty", i+1, field)
		}
		if i > 0 && t == Append && i != len(raw)-1 {
			return nil, fmt.Errorf("%q: %q may only be the last token (it appends one element); bind the fields of an object inside an array at an explicit index, e.g. /items/0/name", field, Append)
		}
		if i > 0 && len(t) > 1 && t[0] == '0' && isDigits(t) {
			return nil, fmt.Errorf("%q: array index %q has a leading zero", field, t)
		}
		p = append(p, t)
	}
	return p, nil
}

// MustParse is Parse for paths known to be valid; it panics otherwise.
func MustParse(field string) Path {
	p, err := Parse(field)
	if err != nil {
		panic(err)
	}
	return p
}

func unescape(tok string) (string, error) {
	if !strings.Contains(tok, "~") {
		return tok, nil
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		if tok[i] != '~' {
			b.WriteByte(tok[i])
			continue
		}
		if i+1 >= len(tok) || (tok[i+1] != '0' && tok[i+1] != '1') {
			return "", errors.New(`"~" must be followed by 0 or 1`)
		}
		if tok[i+1] == '0' {
			b.WriteByte('~')
		} else {
			b.WriteByte('/')
		}
		i++
	}
	return b.String(), nil
}

// String returns p as a JSON Pointer.
func (p Path) String() string {
	var b strings.Builder
	for _, t := range p {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(t))
	}
	return b.String()
}

// Element reports whether the token at position i addresses an array
// element rather than an object field.
func (p Path) Element(i int) bool {
	return i > 0 && (p[i] == Append || isDigits(p[i]))
}

// Index returns the array index a token names, and whether it names one
// ("-" does not: it is resolved against the array's length).
func Index(tok string) (int, bool) {
	if !isDigits(tok) {
		return 0, false
	}
	n, err := strconv.Atoi(tok)
	return n, err == nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// Get returns the value at p in v (decoded JSON: maps, slices, scalars).
func Get(v any, p Path) (any, bool) {
	cur := v
	for i, tok := range p {
		switch c := cur.(type) {
		case map[string]any:
			if p.Element(i) {
				return nil, false
			}
			next, ok := c[tok]
			if !ok {
				return nil, false
			}
			cur = next
		case []any:
			n, ok := Index(tok)
			if !ok || i == 0 || n >= len(c) {
				return nil, false
			}
			cur = c[n]
		default:
			return nil, false
		}
	}
	return cur, true
}

// Set puts v at p in root, creating the objects and arrays on the way (an
// intermediate is an array when the next token addresses an element),
// replacing what is at p, and appending for "-". An element may be set
// only when the elements before it exist: a gap would send nulls no one
// reviewed. It returns the concrete path set ("-" replaced by the index it
// appended at).
func Set(root map[string]any, p Path, v any) (Path, error) {
	if len(p) == 0 {
		return nil, errors.New("the path is empty")
	}
	concrete := make(Path, 0, len(p))
	if _, err := set(root, p, 0, v, &concrete); err != nil {
		return nil, err
	}
	return concrete, nil
}

func set(cur any, p Path, i int, v any, concrete *Path) (any, error) {
	tok, last := p[i], i == len(p)-1
	switch c := cur.(type) {
	case map[string]any:
		if p.Element(i) {
			return nil, fmt.Errorf("%q addresses an array element, but %s is an object", tok, pointer(*concrete))
		}
		*concrete = append(*concrete, tok)
		if last {
			c[tok] = v
			return c, nil
		}
		child, ok := c[tok]
		if !ok {
			child = container(p, i+1)
		}
		next, err := set(child, p, i+1, v, concrete)
		if err != nil {
			return nil, err
		}
		c[tok] = next
		return c, nil
	case []any:
		n := len(c)
		if tok != Append {
			var ok bool
			if n, ok = Index(tok); !ok {
				return nil, fmt.Errorf("%q names an object field, but %s is an array", tok, pointer(*concrete))
			}
		}
		if n > len(c) {
			return nil, fmt.Errorf("element %d of %s cannot be set: the array has %d elements and a gap would send values no one reviewed; bind the elements in order, or append with %s/-",
				n, pointer(*concrete), len(c), pointer(*concrete))
		}
		*concrete = append(*concrete, strconv.Itoa(n))
		var next any
		if last {
			next = v
		} else {
			child := container(p, i+1)
			if n < len(c) {
				child = c[n]
			}
			var err error
			if next, err = set(child, p, i+1, v, concrete); err != nil {
				return nil, err
			}
		}
		if n == len(c) {
			return append(c, next), nil
		}
		c[n] = next
		return c, nil
	default:
		return nil, fmt.Errorf("%s holds %s, not an object or array, so %q cannot be set inside it", pointer(*concrete), Describe(cur), tok)
	}
}

// container is the empty container the token at i goes into.
func container(p Path, i int) any {
	if p.Element(i) {
		return []any{}
	}
	return map[string]any{}
}

func pointer(p Path) string {
	if len(p) == 0 {
		return "the arguments"
	}
	return p.String()
}

// Describe names the JSON type of a decoded value, e.g. "an array".
func Describe(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case float64, float32, int, int32, int64:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return "a value"
}
