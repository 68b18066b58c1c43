//go:build !failpoints

package failpoint

import (
	"os"
	"path/filepath"
	"testing"
)

// A binary built without the tag ignores Env: an armed kill neither ends
// this test process nor leaves a mark.
func TestUntaggedBinaryIgnoresEnv(t *testing.T) {
	markFile := filepath.Join(t.TempDir(), "mark")
	t.Setenv(Env, Spec("x", Kill))
	t.Setenv(MarkEnv, markFile)
	if Enabled {
		t.Fatal("Enabled without the failpoints tag")
	}
	Hit("x")
	if _, err := os.Stat(markFile); !os.IsNotExist(err) {
		t.Errorf("mark file after Hit: %v; want none", err)
	}
}
