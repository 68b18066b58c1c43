package argmap

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    Path
		wantErr string
	}{
		{"query", Path{"query"}, ""},
		{"a/b", Path{"a/b"}, ""}, // a name, not a pointer: backwards compatible
		{"0", Path{"0"}, ""},
		{"/query", Path{"query"}, ""},
		{"/options/depth", Path{"options", "depth"}, ""},
		{"/paths/0", Path{"paths", "0"}, ""},
		{"/paths/-", Path{"paths", "-"}, ""},
		{"/a~1b/c~0d", Path{"a/b", "c~d"}, ""},
		{"/items/10/name", Path{"items", "10", "name"}, ""},
		{"", nil, "empty"},
		{"/", nil, "empty"},
		{"/a//b", nil, "empty"},
		{"/a/", nil, "empty"},
		{"/a~2", nil, `"~" must be followed by 0 or 1`},
		{"/a~", nil, `"~" must be followed by 0 or 1`},
		{"/paths/-/name", nil, "last token"},
		{"/paths/01", nil, "leading zero"},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Parse(%q) = %v, %v; want an error saying %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("Parse(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
		// A pointer round-trips through String.
		if strings.HasPrefix(tt.in, "/") && got.String() != tt.in {
			t.Errorf("Parse(%q).String() = %q", tt.in, got.String())
		}
	}
}

func TestSetAndGet(t *testing.T) {
	t.Parallel()
	type step struct {
		path string
		v    any
	}
	tests := []struct {
		name     string
		start    string
		steps    []step
		want     string
		concrete []string
		wantErr  string
	}{
		{"top-level", `{}`, []step{{"q", "x"}}, `{"q":"x"}`, []string{"/q"}, ""},
		{"creates objects", `{}`, []step{{"/a/b/c", 1.0}}, `{"a":{"b":{"c":1}}}`, []string{"/a/b/c"}, ""},
		{"creates arrays for element tokens", `{}`, []step{{"/a/0", "x"}, {"/a/1", "y"}}, `{"a":["x","y"]}`, []string{"/a/0", "/a/1"}, ""},
		{"appends", `{"a":["x"]}`, []step{{"/a/-", "y"}, {"/a/-", "z"}}, `{"a":["x","y","z"]}`, []string{"/a/1", "/a/2"}, ""},
		{"objects inside arrays", `{}`, []step{{"/f/0/p", "x"}, {"/f/0/m", "r"}, {"/f/1/p", "y"}}, `{"f":[{"m":"r","p":"x"},{"p":"y"}]}`, []string{"/f/0/p", "/f/0/m", "/f/1/p"}, ""},
		{"replaces a value and an element", `{"a":{"b":1},"l":[1,2]}`, []step{{"/a/b", 2.0}, {"/l/0", 9.0}}, `{"a":{"b":2},"l":[9,2]}`, []string{"/a/b", "/l/0"}, ""},
		{"a numeric first token names a field", `{}`, []step{{"0", "x"}}, `{"0":"x"}`, []string{"/0"}, ""},
		{"a gap", `{}`, []step{{"/a/1", "x"}}, "", nil, "gap"},
		{"an element token into an object", `{"a":{}}`, []step{{"/a/0", "x"}}, "", nil, "is an object"},
		{"a field token into an array", `{"a":[]}`, []step{{"/a/b", "x"}}, "", nil, "is an array"},
		{"through a scalar", `{"a":"s"}`, []step{{"/a/b", "x"}}, "", nil, "holds a string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var root map[string]any
			if err := json.Unmarshal([]byte(tt.start), &root); err != nil {
				t.Fatal(err)
			}
			var concrete []string
			var err error
			for _, s := range tt.steps {
				var c Path
				if c, err = Set(root, MustParse(s.path), s.v); err != nil {
					break
				}
				concrete = append(concrete, c.String())
				if got, ok := Get(root, c); !ok || got != s.v {
					t.Errorf("Get(%s) = %v, %v after setting %v", c, got, ok, s.v)
				}
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Set: %v, want an error saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := json.Marshal(root)
			if string(raw) != tt.want || !slices.Equal(concrete, tt.concrete) {
				t.Errorf("after Set: %s at %v, want %s at %v", raw, concrete, tt.want, tt.concrete)
			}
		})
	}
}

func TestGetMisses(t *testing.T) {
	t.Parallel()
	var doc map[string]any
	if err := json.Unmarshal([]byte(`{"a":{"b":[1,{"c":2}]},"s":"x"}`), &doc); err != nil {
		t.Fatal(err)
	}
	if v, ok := Get(doc, MustParse("/a/b/1/c")); !ok || v != 2.0 {
		t.Errorf("Get(/a/b/1/c) = %v, %v", v, ok)
	}
	for _, p := range []string{"/a/x", "/a/b/2", "/a/b/-", "/s/x", "/a/b/c", "nope"} {
		if v, ok := Get(doc, MustParse(p)); ok {
			t.Errorf("Get(%s) = %v, want nothing", p, v)
		}
	}
}

// FuzzPath: any field either fails to parse or parses to a path that
// round-trips through its pointer form and can be set and read back in
// an empty arguments object (or is refused, never half-written).
func FuzzPath(f *testing.F) {
	for _, s := range []string{"query", "/options/depth", "/paths/0", "/paths/-", "/a~1b/~0", "/items/0/name", "/x/1", "//", "/a/-/b", "/p/01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, field string) {
		p, err := Parse(field)
		if err != nil {
			return
		}
		again, err := Parse(p.String())
		if err != nil || !slices.Equal(again, p) {
			t.Fatalf("Parse(%q) = %q; its pointer %q parses to %q, %v", field, p, p.String(), again, err)
		}
		root := map[string]any{}
		concrete, err := Set(root, p, "v")
		if err != nil {
			if len(root) != 0 {
				t.Fatalf("Set(%q) failed but wrote %v", field, root)
			}
			return
		}
		if got, ok := Get(root, concrete); !ok || got != "v" {
			t.Fatalf("Set(%q) at %q, then Get = %v, %v", field, concrete, got, ok)
		}
	})
}
