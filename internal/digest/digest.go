// Package digest computes the SHA-256 digests that identify schemas,
// descriptions, arguments and content across V0M3. JSON values are digested
// in their RFC 8785 (JCS) canonical form, so the same value always has the
// same digest whatever key order or number spelling a server used.
package digest

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// Prefix starts every digest string.
const Prefix = "sha256:"

// Bytes returns "sha256:" + hex of b.
func Bytes(b []byte) string {
	s := sha256.Sum256(b)
	return Prefix + hex.EncodeToString(s[:])
}

// JSON returns the digest of the canonical form of any JSON-marshalable
// value. A nil value digests as JSON null.
func JSON(v any) (string, error) {
	c, err := CanonicalValue(v)
	if err != nil {
		return "", err
	}
	return Bytes(c), nil
}

// Struct returns the digest of a protobuf Struct, or "" when s is nil (an
// absent schema has no digest).
func Struct(s *structpb.Struct) (string, error) {
	if s == nil {
		return "", nil
	}
	return JSON(s.AsMap())
}

// Message returns the digest of m's deterministic protobuf encoding: equal
// for two readings of one record by the same build, so it tells whether two
// services read the same state. It is not canonical across builds (a
// field one build does not know changes it): compare it, never store it.
func Message(m proto.Message) (string, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("digest: marshal %T: %w", m, err)
	}
	return Bytes(b), nil
}

// String returns the digest of s encoded as a JSON string.
func String(s string) string {
	var buf bytes.Buffer
	writeString(&buf, s)
	return Bytes(buf.Bytes())
}

// Strings returns JSON(strs) for a non-empty list of strings, written in
// canonical form directly rather than marshalled and parsed again: for
// the keys a store digests on every call.
func Strings(strs ...string) string {
	var buf bytes.Buffer
	writeStrings(&buf, strs)
	return Bytes(buf.Bytes())
}

// writeStrings writes a list of strings in canonical form.
func writeStrings(buf *bytes.Buffer, strs []string) {
	buf.WriteByte('[')
	for i, s := range strs {
		if i > 0 {
			buf.WriteByte(',')
		}
		writeString(buf, s)
	}
	buf.WriteByte(']')
}

// CanonicalValue marshals v to JSON and returns its canonical form. A
// value made of the types JSON decodes to (maps of strings to values,
// lists, strings, numbers, booleans, nil), as arguments and schemas are,
// is written in canonical form directly; any other is marshalled and
// parsed again first. Both give the same bytes.
func CanonicalValue(v any) ([]byte, error) {
	var buf bytes.Buffer
	if ok, err := writeValue(&buf, v); ok || err != nil {
		return buf.Bytes(), err
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("digest: marshal: %w", err)
	}
	return Canonical(raw)
}

// writeValue writes v in canonical form if it is made only of the types
// JSON decodes to (and []string and integers), and reports false, having
// written something or not, for any other: CanonicalValue then marshals
// it. A map key that is not valid UTF-8 is left to marshalling too, which
// replaces its invalid bytes (two keys may then become one).
func writeValue(buf *bytes.Buffer, v any) (bool, error) {
	switch x := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		buf.WriteString(strconv.FormatBool(x))
	case string:
		writeString(buf, x)
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil {
			return true, fmt.Errorf("digest: number %s: %w", x, err)
		}
		return true, writeNumber(buf, f)
	case float64:
		return true, writeNumber(buf, x)
	// An integer marshals as its decimal digits, which parse to the
	// nearest float64, as the conversion rounds it.
	case int:
		return true, writeNumber(buf, float64(x))
	case int32:
		return true, writeNumber(buf, float64(x))
	case int64:
		return true, writeNumber(buf, float64(x))
	case uint32:
		return true, writeNumber(buf, float64(x))
	case uint64:
		return true, writeNumber(buf, float64(x))
	case []string:
		writeStrings(buf, x)
	case []any:
		buf.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				buf.WriteByte(',')
			}
			if ok, err := writeValue(buf, e); !ok || err != nil {
				return ok, err
			}
		}
		buf.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			if !utf8.ValidString(k) {
				return false, nil
			}
			keys = append(keys, k)
		}
		slices.SortFunc(keys, compareUTF16)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeString(buf, k)
			buf.WriteByte(':')
			if ok, err := writeValue(buf, x[k]); !ok || err != nil {
				return ok, err
			}
		}
		buf.WriteByte('}')
	default:
		return false, nil
	}
	return true, nil
}

// Canonical returns the RFC 8785 canonical form of a JSON text.
func Canonical(raw []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("digest: parse JSON: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("digest: trailing data after JSON value")
	}
	var buf bytes.Buffer
	// A decoded value is made of the types writeValue writes, with valid
	// UTF-8 keys (the decoder replaces invalid bytes).
	if ok, err := writeValue(&buf, v); !ok || err != nil {
		return nil, cmp.Or(err, fmt.Errorf("digest: unexpected JSON type %T", v))
	}
	return buf.Bytes(), nil
}

func writeNumber(buf *bytes.Buffer, f float64) error {
	s, err := formatNumber(f)
	if err != nil {
		return err
	}
	buf.WriteString(s)
	return nil
}

// compareUTF16 orders two keys by their UTF-16 code units (RFC 8785
// §3.2.3) without encoding them: a rune outside the Basic Multilingual
// Plane compares as its surrogate pair, which sorts before U+E000-U+FFFF.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		a, b = a[na:], b[nb:]
		if ra == rb {
			continue
		}
		ha, la := utf16.EncodeRune(ra)
		hb, lb := utf16.EncodeRune(rb)
		if ha == utf8.RuneError { // in the BMP: one code unit
			ha, la = ra, -1
		}
		if hb == utf8.RuneError {
			hb, lb = rb, -1
		}
		if c := cmp.Compare(ha, hb); c != 0 {
			return c
		}
		return cmp.Compare(la, lb)
	}
	return cmp.Compare(len(a), len(b))
}

// formatNumber serializes f as ECMAScript's Number.prototype.toString does
// (RFC 8785 §3.2.2.3).
func formatNumber(f float64) (string, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "", fmt.Errorf("digest: %v is not valid JSON", f)
	}
	if f == 0 {
		return "0", nil
	}
	sign := ""
	if f < 0 {
		sign, f = "-", -f
	}
	// Shortest round-tripping digits and decimal exponent.
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±xx
	mant, expStr, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	exp, _ := strconv.Atoi(expStr)
	k, n := len(digits), exp+1
	var s string
	switch {
	case k <= n && n <= 21:
		s = digits + strings.Repeat("0", n-k)
	case 0 < n && n <= 21:
		s = digits[:n] + "." + digits[n:]
	case -6 < n && n <= 0:
		s = "0." + strings.Repeat("0", -n) + digits
	default:
		m := digits[:1]
		if k > 1 {
			m += "." + digits[1:]
		}
		es := strconv.Itoa(n - 1)
		if n-1 >= 0 {
			es = "+" + es
		}
		s = m + "e" + es
	}
	return sign + s, nil
}

func writeString(buf *bytes.Buffer, s string) {
	buf.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			buf.WriteString(`\"`)
		case '\\':
			buf.WriteString(`\\`)
		case '\b':
			buf.WriteString(`\b`)
		case '\f':
			buf.WriteString(`\f`)
		case '\n':
			buf.WriteString(`\n`)
		case '\r':
			buf.WriteString(`\r`)
		case '\t':
			buf.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(buf, `\u%04x`, r)
			} else {
				buf.WriteRune(r)
			}
		}
	}
	buf.WriteByte('"')
}
