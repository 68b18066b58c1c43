package orchestrator

import (
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/grant"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestRemoteArguments: the remote arguments a mapping builds, as JSON (the
// wire form the adapter sends and the grant digests).
func TestRemoteArguments(t *testing.T) {
	t.Parallel()
	normalized := map[string]any{"source": "h_token", "query": "limits", "depth": int64(3), "ratio": 0.5}
	targets := map[string]string{"source": "/srv/docs/guide.md"}
	bind := func(remote, product string) *registryv1.ArgumentBinding {
		return &registryv1.ArgumentBinding{RemoteField: remote, ProductField: product}
	}
	handle := func(remote string) *registryv1.ArgumentBinding {
		return &registryv1.ArgumentBinding{RemoteField: remote, ProductField: "source", FromHandle: true}
	}
	constant := func(remote string, v any) *registryv1.ArgumentBinding {
		c, err := structpb.NewValue(v)
		if err != nil {
			t.Fatal(err)
		}
		return &registryv1.ArgumentBinding{RemoteField: remote, Constant: c}
	}
	tests := []struct {
		name     string
		defaults map[string]any
		bindings []*registryv1.ArgumentBinding
		want     string // JSON; "" with wantErr
		wantErr  string
	}{
		{"flat names, as before paths", nil,
			[]*registryv1.ArgumentBinding{bind("query", "query"), handle("uri")},
			`{"query":"limits","uri":"/srv/docs/guide.md"}`, ""},
		{"a handle into a one-element array, by index", nil,
			[]*registryv1.ArgumentBinding{handle("/paths/0")},
			`{"paths":["/srv/docs/guide.md"]}`, ""},
		{"a handle appended", nil,
			[]*registryv1.ArgumentBinding{handle("/paths/-")},
			`{"paths":["/srv/docs/guide.md"]}`, ""},
		{"appends follow a default array", map[string]any{"paths": []any{"/srv/docs/index.md"}},
			[]*registryv1.ArgumentBinding{handle("/paths/-"), constant("/paths/-", "/srv/docs/notes.md")},
			`{"paths":["/srv/docs/index.md","/srv/docs/guide.md","/srv/docs/notes.md"]}`, ""},
		{"nested objects are created, integers stay integers", nil,
			[]*registryv1.ArgumentBinding{bind("/options/depth", "depth"), bind("/options/search/text", "query")},
			`{"options":{"depth":3,"search":{"text":"limits"}}}`, ""},
		{"numbers keep their fraction", nil,
			[]*registryv1.ArgumentBinding{bind("/weights/0", "ratio")},
			`{"weights":[0.5]}`, ""},
		{"deep merge: a binding wins at its path, the defaults around it stay",
			map[string]any{"options": map[string]any{"depth": 1, "follow": true}, "format": "text"},
			[]*registryv1.ArgumentBinding{bind("/options/depth", "depth")},
			`{"format":"text","options":{"depth":3,"follow":true}}`, ""},
		{"constants of every JSON type", nil,
			[]*registryv1.ArgumentBinding{
				constant("encoding", "utf-8"), constant("/limits/max", 10), constant("/flags/0", true),
				constant("/filter", map[string]any{"tags": []any{"faq"}}), constant("cursor", nil),
			},
			`{"cursor":null,"encoding":"utf-8","filter":{"tags":["faq"]},"flags":[true],"limits":{"max":10}}`, ""},
		{"elements of an object inside an array", nil,
			[]*registryv1.ArgumentBinding{handle("/files/0/path"), constant("/files/0/mode", "r")},
			`{"files":[{"mode":"r","path":"/srv/docs/guide.md"}]}`, ""},
		{"a product field the request leaves out is not sent", nil,
			[]*registryv1.ArgumentBinding{bind("/options/cursor", "cursor"), bind("query", "query")},
			`{"query":"limits"}`, ""},
		{"a gap in an array fails instead of sending null", nil,
			[]*registryv1.ArgumentBinding{handle("/paths/1")},
			"", "gap"},
		{"a path through a scalar fails", map[string]any{"options": "fast"},
			[]*registryv1.ArgumentBinding{bind("/options/depth", "depth")},
			"", "not an object or array"},
		{"a handle field the capability does not declare fails", nil,
			[]*registryv1.ArgumentBinding{{RemoteField: "q", ProductField: "query", FromHandle: true}},
			"", "does not declare it a handle field"},
		{"an invalid path fails", nil,
			[]*registryv1.ArgumentBinding{bind("/paths/-/x", "query")},
			"", "last token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := &registryv1.Mapping{
				Target:      &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "read"},
				ArgumentMap: tt.bindings,
			}
			if tt.defaults != nil {
				m.Defaults = mustStruct(t, tt.defaults)
			}
			got, err := remoteArguments(m, normalized, targets)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("remoteArguments = %v, %v; want an error saying %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			raw, err := json.Marshal(got.AsMap())
			if err != nil {
				t.Fatal(err)
			}
			if string(raw) != tt.want {
				t.Errorf("remote arguments = %s, want %s", raw, tt.want)
			}
			// The handle token itself never reaches the remote.
			if strings.Contains(string(raw), "h_token") {
				t.Errorf("the handle token was sent: %s", raw)
			}
			// The defaults stay as reviewed: building never writes into
			// the mapping.
			if tt.defaults != nil {
				if d, _ := json.Marshal(m.GetDefaults().AsMap()); !jsonEqual(t, d, tt.defaults) {
					t.Errorf("defaults changed to %s", d)
				}
			}
		})
	}
}

// TestRemoteArgumentsGrantDigest: the grant binds the arguments the
// adapter will send, nested or not, independent of key order, and any
// change to a nested value changes the digest.
func TestRemoteArgumentsGrantDigest(t *testing.T) {
	t.Parallel()
	m := &registryv1.Mapping{
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "read_multiple_files"},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "/paths/0", ProductField: "source", FromHandle: true},
			{RemoteField: "/options/depth", ProductField: "depth"},
		},
	}
	build := func(target string, depth int64) string {
		args, err := remoteArguments(m, map[string]any{"source": "h", "depth": depth}, map[string]string{"source": target})
		if err != nil {
			t.Fatal(err)
		}
		d, err := grant.ArgumentsDigest(args)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a, b := build("/srv/a.md", 2), build("/srv/a.md", 2)
	if a != b {
		t.Errorf("the same arguments digest differently: %s, %s", a, b)
	}
	same, err := grant.ArgumentsDigest(mustStruct(t, map[string]any{"options": map[string]any{"depth": 2}, "paths": []any{"/srv/a.md"}}))
	if err != nil {
		t.Fatal(err)
	}
	if a != same {
		t.Errorf("digest of the built arguments %s, of the same JSON %s", a, same)
	}
	if build("/srv/b.md", 2) == a || build("/srv/a.md", 3) == a {
		t.Error("a different nested value kept the digest")
	}
}

func jsonEqual(t *testing.T, raw []byte, want map[string]any) bool {
	t.Helper()
	w, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var x, y any
	if json.Unmarshal(raw, &x) != nil || json.Unmarshal(w, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}
