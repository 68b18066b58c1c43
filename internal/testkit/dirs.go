package testkit

import (
	"os"
	"testing"
)

// WritableDir returns a temporary directory every uid may write, removed
// after the test: for what a local server writes (call logs, markers,
// work files). A root adapter runs each local server under a uid of its
// own, and t.TempDir is closed to other uids.
func WritableDir(t testing.TB) string { return tempDir(t, 0o777) }

// ReachableDir returns a temporary directory every uid may read and
// traverse but only its owner writes, removed after the test: for a
// server's executable, which the adapter refuses to start from a place
// anyone could have replaced it.
func ReachableDir(t testing.TB) string { return tempDir(t, 0o755) }

func tempDir(t testing.TB, mode os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "v0m3-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}
