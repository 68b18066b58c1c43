// Package proto_test checks that the committed generated code is exactly
// what the pinned generators produce from the committed contracts.
package proto_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedCodeHasNotDrifted regenerates every contract into a
// temporary directory with `go tool buf generate` (the plugins pinned in
// go.mod) and compares it byte for byte with the committed files.
func TestGeneratedCodeHasNotDrifted(t *testing.T) {
	if testing.Short() {
		t.Skip("regeneration builds buf and its plugins")
	}
	out := t.TempDir()
	cmd := exec.Command("go", "tool", "buf", "generate", "--output", out)
	cmd.Dir = ".." // the module root, where buf.yaml and buf.gen.yaml live
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go tool buf generate: %v\n%s", err, b)
	}
	generated := map[string][]byte{}
	err := filepath.WalkDir(filepath.Join(out, "proto"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(filepath.Join(out, "proto"), path)
		b, err := os.ReadFile(path)
		generated[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(generated) == 0 {
		t.Fatal("buf generated nothing")
	}
	committed := map[string]bool{}
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".pb.go") {
			return err
		}
		committed[path] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for rel, want := range generated {
		got, err := os.ReadFile(rel)
		if err != nil {
			t.Errorf("%s is generated but not committed; run 'make generate'", rel)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what the generators produce; run 'make generate' and commit", rel)
		}
	}
	for rel := range committed {
		if _, ok := generated[rel]; !ok {
			t.Errorf("%s is committed but no longer generated; delete it", rel)
		}
	}
}
