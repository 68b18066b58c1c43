package digest

import (
	"testing"
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
