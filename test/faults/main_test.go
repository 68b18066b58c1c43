package faults_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/v0m3/v0m3/services/adapter"
)

// v0m3Bin is the v0m3 binary built with the failpoints tag, once for
// every test here: each service process and the fixture renderer.
var v0m3Bin string

func TestMain(m *testing.M) {
	// The in-process adapter re-executes this test binary as the sandbox
	// launcher of each local server it starts.
	if adapter.IsSandboxLaunch() {
		adapter.RunSandboxLaunch()
	}
	dir, err := os.MkdirTemp("", "v0m3-faults-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The adapter runs stdio servers (the renderer is this binary) only
	// from a place nobody else may replace them.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	v0m3Bin = filepath.Join(dir, "v0m3")
	build := exec.Command("go", "build", "-tags", "failpoints", "-o", v0m3Bin, "github.com/v0m3/v0m3/cmd/v0m3")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build v0m3 with fail points:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
