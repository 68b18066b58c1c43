package failpoint

import (
	"maps"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		spec string
		want map[string]string
		ok   bool
	}{
		{"", map[string]string{}, true},
		{"a.b=kill", map[string]string{"a.b": Kill}, true},
		{" a=kill , b=freeze ,", map[string]string{"a": Kill, "b": Freeze}, true},
		{"a", nil, false},
		{"=kill", nil, false},
		{"a=explode", nil, false},
		{"a=kill,a=freeze", nil, false},
	} {
		got, err := Parse(tc.spec)
		if (err == nil) != tc.ok || (tc.ok && !maps.Equal(got, tc.want)) {
			t.Errorf("Parse(%q) = %v, %v; want %v (ok %v)", tc.spec, got, err, tc.want, tc.ok)
		}
	}
}
