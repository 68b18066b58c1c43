package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
)

// BuildBinaries builds each Go package (an import path) into a new
// directory and returns the binaries' paths, in the order given, and a
// function that removes them. The directory is readable by every uid: a
// root adapter runs each local server under a uid of its own, which must
// reach the executable as it would in production. Meant for TestMain, so
// it returns errors rather than failing a test; build output goes to
// stderr.
func BuildBinaries(pkgs ...string) ([]string, func(), error) {
	dir, err := os.MkdirTemp("", "v0m3-test-bin-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	if err := os.Chmod(dir, 0o755); err != nil {
		cleanup()
		return nil, nil, err
	}
	paths := make([]string, len(pkgs))
	for i, pkg := range pkgs {
		paths[i] = filepath.Join(dir, path.Base(pkg))
		build := exec.Command("go", "build", "-o", paths[i], pkg)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			cleanup()
			return nil, nil, fmt.Errorf("build %s: %w", pkg, err)
		}
	}
	return paths, cleanup, nil
}
