package digest

import (
	"encoding/json"
	"math"
	"slices"
	"testing"
	"unicode/utf16"
)

// Vectors from RFC 8785 and its reference implementations.
func TestCanonical(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		{"key order", `{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{"nested and whitespace", `{ "z": [1, {"y":true, "x":null}], "a":"s" }`, `{"a":"s","z":[1,{"x":null,"y":true}]}`},
		{"numbers", `[1.0, -0, 1e21, 1e20, 0.000001, 1e-7, 333333333.33333329, 4.50, 2e-3, 123456789012345680000]`,
			`[1,0,1e+21,100000000000000000000,0.000001,1e-7,333333333.3333333,4.5,0.002,123456789012345680000]`},
		{"string escapes", `"\u20ac$\u000f\u000aA'\u0042\u0022\u005c\\\"\/"`, `"€$\u000f\nA'B\"\\\\\"/"`},
		{"utf16 key order", `{"\u20ac":1,"\ud83d\ude00":2,"\u0080":3,"1":4}`, `{"1":4,"` + "\u0080" + `":3,"` + "\u20ac" + `":1,"` + "\U0001F600" + `":2}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Canonical([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("Canonical(%s)\n got %s\nwant %s", tt.in, got, tt.want)
			}
		})
	}
}

func TestSameValueSameDigest(t *testing.T) {
	t.Parallel()
	a, err := Canonical([]byte(`{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Canonical([]byte(`{"required":["query"],"properties":{"query":{"type":"string"}},"type":"object"}`))
	if err != nil {
		t.Fatal(err)
	}
	if Bytes(a) != Bytes(b) {
		t.Fatal("reordered schema produced a different digest")
	}
	c, _ := Canonical([]byte(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`))
	if Bytes(a) == Bytes(c) {
		t.Fatal("changed schema produced the same digest")
	}
}

func TestRejectsInvalid(t *testing.T) {
	t.Parallel()
	for _, in := range []string{`{`, `{"a":1} {"b":2}`, ``} {
		if _, err := Canonical([]byte(in)); err == nil {
			t.Errorf("Canonical(%q) = nil error, want error", in)
		}
	}
}

func TestString(t *testing.T) {
	t.Parallel()
	if String("a") == String("b") {
		t.Fatal("different descriptions share a digest")
	}
	want := Bytes([]byte(`"Search notes"`))
	if got := String("Search notes"); got != want {
		t.Fatalf("String = %s, want %s", got, want)
	}
}

// Strings is JSON of the same list, byte for byte: store keys digested
// before it existed stay the keys it computes.
func TestStringsIsJSON(t *testing.T) {
	t.Parallel()
	for _, parts := range [][]string{
		{""},
		{"conn_1", "v0m3-sources://notes/rate-limits"},
		{"task_1"},
		{`quote " backslash \ slash /`, "tab\tnewline\ncr\rbell\x07 nul\x00"},
		{"<html> & 'quotes'", "line\u2028separator\u2029", "emoji 😀 € \u0080"},
		{"invalid \xff\xfe utf-8", "\x1f\x7f"},
	} {
		want, err := JSON(parts)
		if err != nil {
			t.Fatal(err)
		}
		if got := Strings(parts...); got != want {
			t.Errorf("Strings(%q) = %s, JSON = %s", parts, got, want)
		}
	}
}

func BenchmarkStrings(b *testing.B) {
	parts := []string{"conn_2w5tq4b3l6h7x", "v0m3-sources://notes/rate-limits"}
	b.Run("JSON", func(b *testing.B) {
		for b.Loop() {
			if _, err := JSON(parts); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Strings", func(b *testing.B) {
		for b.Loop() {
			Strings(parts...)
		}
	})
}

// viaJSON is the canonical form of v by way of its marshalled text, as
// CanonicalValue computes it for a value it cannot write directly.
func viaJSON(t testing.TB, v any) []byte {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Canonical(raw)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A value CanonicalValue writes directly digests exactly as its JSON text
// does: digests stored before the direct path stay the digests it
// computes.
func TestCanonicalValueMatchesJSON(t *testing.T) {
	t.Parallel()
	for _, v := range []any{
		nil, true, false, "", "plain", "<html> & \u2028 \x07 \xff invalid", 0.0, math.Copysign(0, -1), 1.0, -1.5, 1e21, 1e-7,
		333333333.33333329, 123456789012345680000.0, json.Number("4.50"), json.Number("1e3"),
		[]any{}, []string{}, []string{"a", "\"q\"", "😀"}, map[string]any{},
		[]any{1.0, "two", nil, []any{map[string]any{"z": 1.0, "a": []any{}}}},
		map[string]any{
			"b": 1.0, "a": 2.0, "\u20ac": "euro", "\U0001F600": "emoji", "\uffff": "last of the BMP", "\ue000": "private use",
			"\u0080": 3.0, "1": true, "": nil, "aa": "longer", "nested": map[string]any{"y": []any{"x"}, "x": false},
		},
		// Integers, as limits are digested.
		map[string]any{"int": 3, "int32": int32(-7), "int64": int64(math.MaxInt64), "uint32": uint32(math.MaxUint32),
			"uint64": uint64(math.MaxUint64), "above 2^53": int64(1<<53 + 1), "types": []string{}, "flag": true},
		// Not all JSON-decoded types: marshalled first.
		map[string]any{"s": []int{1, 2}, "m": map[string]string{"k": "v"}},
		struct {
			B string `json:"b"`
			A int    `json:"a"`
		}{"x", 1},
		// Keys that marshalling makes one: left to it.
		map[string]any{"k\xff": 1.0, "k\xfe": 2.0},
	} {
		got, err := CanonicalValue(v)
		if err != nil {
			t.Fatalf("CanonicalValue(%#v): %v", v, err)
		}
		if want := viaJSON(t, v); string(got) != string(want) {
			t.Errorf("CanonicalValue(%#v)\n got %s\nwant %s", v, got, want)
		}
	}
}

func TestCanonicalValueRefusesWhatJSONCannotHold(t *testing.T) {
	t.Parallel()
	for _, v := range []any{math.NaN(), math.Inf(1), []any{math.Inf(-1)}, map[string]any{"a": math.NaN()}, json.Number("x"), func() {}} {
		if _, err := CanonicalValue(v); err == nil {
			t.Errorf("CanonicalValue(%v) = nil error, want error", v)
		}
	}
}

// compareUTF16 orders strings as their UTF-16 encodings compare.
func TestCompareUTF16(t *testing.T) {
	t.Parallel()
	words := []string{"", "a", "aa", "ab", "b", "\u0080", "\u20ac", "\ud7ff", "\ue000", "\uffff", "\U00010000", "\U0001F600", "a\U0001F600", "a\uffff", "\xff"}
	for _, a := range words {
		for _, b := range words {
			want := slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
			if got := compareUTF16(a, b); got != want {
				t.Errorf("compareUTF16(%q, %q) = %d, want %d", a, b, got, want)
			}
		}
	}
}

func BenchmarkCanonicalValue(b *testing.B) {
	args := map[string]any{"query": "migration", "source": "h_jukb2fxoqsdzliaan6ehcb6skkrso2czdmjhqym4sf3kwa3lnjrq2",
		"limit": 5.0, "filters": []any{map[string]any{"field": "title", "op": "contains", "value": "rate limits"}}}
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if _, err := CanonicalValue(args); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("via-json", func(b *testing.B) {
		for b.Loop() {
			viaJSON(b, args)
		}
	})
}
