package testkit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Script returns the path of scripts/<name> in the repository, found by
// walking up from the working directory (a test's package directory).
func Script(name string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "scripts", name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("scripts/" + name + " not found above the working directory")
		}
		dir = parent
	}
}

// EnvtestAssets returns the directory of the kube-apiserver and etcd that
// scripts/envtest.sh builds from source (once, cached), or
// $KUBEBUILDER_ASSETS when set.
func EnvtestAssets() (string, error) {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d, nil
	}
	script, err := Script("envtest.sh")
	if err != nil {
		return "", err
	}
	cmd := exec.Command("bash", script)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("scripts/envtest.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}
