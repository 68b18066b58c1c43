package provenance_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/v0m3/v0m3/internal/provenance"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

func TestDataURI(t *testing.T) {
	t.Parallel()
	a, err := provenance.DataURI("conn_1", "search_nodes", map[string]any{"query": "alice", "limit": 3.0})
	if err != nil {
		t.Fatal(err)
	}
	// The same call is the same identity, whatever the key order.
	b, _ := provenance.DataURI("conn_1", "search_nodes", map[string]any{"limit": 3.0, "query": "alice"})
	other, _ := provenance.DataURI("conn_1", "search_nodes", map[string]any{"query": "bob", "limit": 3.0})
	otherConn, _ := provenance.DataURI("conn_2", "search_nodes", map[string]any{"query": "alice", "limit": 3.0})
	empty, _ := provenance.DataURI("conn_1", "read_graph", nil)
	if a != b || a == other || a == otherConn || !provenance.IsDataURI(a) || !provenance.IsDataURI(empty) {
		t.Errorf("identities: %q %q %q %q %q", a, b, other, otherConn, empty)
	}
	// The arguments appear only as a digest.
	if strings.Contains(a, "alice") || !strings.HasPrefix(a, "v0m3-data:conn_1/tools/search_nodes/calls/") {
		t.Errorf("identity %q spells out its arguments or has another shape", a)
	}
	// A tool name cannot add path segments.
	odd, _ := provenance.DataURI("conn_1", "a/../b", nil)
	if !strings.Contains(odd, "/tools/a%2F..%2Fb/calls/") {
		t.Errorf("identity of an odd tool name: %q", odd)
	}
}

func TestIsDataURI(t *testing.T) {
	t.Parallel()
	for uri, want := range map[string]bool{
		"v0m3-data:conn/tools/x/calls/ab": true,
		"V0M3-DATA:anything":              true,
		" v0m3-data :x":                   true,
		"file:///tmp/v0m3-data:x":         false,
		"/tmp/notes.md":                   false,
		"v0m3-sources://notes/a":          false,
		"":                                false,
	} {
		if got := provenance.IsDataURI(uri); got != want {
			t.Errorf("IsDataURI(%q) = %t, want %t", uri, got, want)
		}
	}
}

func TestResultKind(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		effect registryv1.EffectClass
		kind   registryv1.ResultKind
		want   registryv1.ResultKind
	}{
		{registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL, 0, registryv1.ResultKind_RESULT_KIND_SOURCE_OBSERVATION},
		{registryv1.EffectClass_EFFECT_CLASS_LOCAL_TRANSFORMATION, 0, registryv1.ResultKind_RESULT_KIND_ARTIFACT},
		{registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT, 0, registryv1.ResultKind_RESULT_KIND_RECEIPT},
		{registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL, registryv1.ResultKind_RESULT_KIND_DATA, registryv1.ResultKind_RESULT_KIND_DATA},
	} {
		if got := provenance.ResultKind(&registryv1.Capability{EffectClass: c.effect, ResultKind: c.kind}); got != c.want {
			t.Errorf("ResultKind(%v, %v) = %v, want %v", c.effect, c.kind, got, c.want)
		}
	}
}

func TestStringAt(t *testing.T) {
	t.Parallel()
	var doc map[string]any
	if err := json.Unmarshal([]byte(`{"uri":"file:///a","n":3,"hits":[{"source":{"uri":"file:///b"}}],"a/b":{"~x":"c"}}`), &doc); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ptr, want string
		ok        bool
	}{
		{"/uri", "file:///a", true},
		{"/hits/0/source/uri", "file:///b", true},
		{"/a~1b/~0x", "c", true},
		{"/n", "", false},
		{"/missing", "", false},
		{"/hits/1/source/uri", "", false},
		{"/hits/01/source/uri", "", false},
		{"/hits/-/source/uri", "", false},
		{"/uri/x", "", false},
		{"", "", false},
		{"uri", "", false},
		{"/a~2b", "", false},
	} {
		got, err := provenance.StringAt(doc, c.ptr)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("StringAt(%q) = %q, %v; want %q (ok %t)", c.ptr, got, err, c.want, c.ok)
		}
		if err != nil && strings.Contains(err.Error(), "file:///") {
			t.Errorf("StringAt(%q) error quotes remote content: %v", c.ptr, err)
		}
	}
}

func TestCheckPointerInSchema(t *testing.T) {
	t.Parallel()
	var schema map[string]any
	if err := json.Unmarshal([]byte(`{
		"type": "object",
		"properties": {
			"uri": {"type": "string"},
			"count": {"type": "integer"},
			"any": {},
			"source": {"$ref": "#/$defs/source"},
			"hits": {"type": "array", "items": {"$ref": "#/$defs/source"}},
			"pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": ["string", "null"]}]},
			"loop": {"$ref": "#/$defs/loop"},
			"remote": {"$ref": "https://example.com/schema.json"}
		},
		"$defs": {
			"source": {"type": "object", "properties": {"uri": {"type": "string"}}},
			"loop": {"$ref": "#/$defs/loop"}
		}
	}`), &schema); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ptr string
		ok  bool
	}{
		{"/uri", true},
		{"/any", true},
		{"/source/uri", true},
		{"/hits/0/uri", true},
		{"/pair/1", true},
		{"/pair/0", false},
		{"/count", false},
		{"/missing", false},
		{"/source/other", false},
		{"/hits/x/uri", false},
		{"/loop", false},
		{"/remote", false},
		{"/", false},
		{"", false},
		{"not-a-pointer", false},
	} {
		err := provenance.CheckPointerInSchema(schema, c.ptr)
		if (err == nil) != c.ok {
			t.Errorf("CheckPointerInSchema(%q) = %v, want ok %t", c.ptr, err, c.ok)
		}
	}
}
