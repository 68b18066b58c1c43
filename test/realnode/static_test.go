package realnode_test

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// repoRoot is the repository root, two levels above this package.
var repoRoot = filepath.Join("..", "..")

// The operator copies the v0m3 binary into arbitrary server images (the
// stdio bridge), so the binary every build path produces must be static: no
// ELF interpreter and no shared library. Both paths are checked: the
// Makefile's build and the settings skaffold gives ko for the image.
func TestV0M3BinaryIsStatic(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		build func(t *testing.T, out string) *exec.Cmd
	}{
		{"make build", func(t *testing.T, out string) *exec.Cmd {
			return exec.Command("make", "-C", repoRoot, "build", "BIN="+out)
		}},
		{"skaffold ko artifact", func(t *testing.T, out string) *exec.Cmd {
			env, flags := skaffoldKo(t)
			cmd := exec.Command("go", append(append([]string{"build"}, flags...), "-o", out, "./cmd/v0m3")...)
			cmd.Dir = repoRoot
			// ko builds with CGO_ENABLED=0 unless told otherwise; start from
			// the opposite so only skaffold.yaml's env can make it static.
			cmd.Env = append(append(os.Environ(), "CGO_ENABLED=1"), env...)
			return cmd
		}},
	}
	for _, tt := range tests {
		// Sequential: the second build reuses the first one's compiled
		// packages when both use the same settings.
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "v0m3")
			if b, err := tt.build(t, out).CombinedOutput(); err != nil {
				t.Fatalf("build: %v\n%s", err, b)
			}
			if why := dynamic(t, out); why != "" {
				t.Errorf("%s builds a dynamically linked v0m3 (%s); it would not run in a distroless or scratch server image", tt.name, why)
			}
		})
	}
}

// skaffoldKo returns the env and flags skaffold.yaml gives ko for the v0m3
// image.
func skaffoldKo(t *testing.T) (env, flags []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "skaffold.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Build struct {
			Artifacts []struct {
				Image string `json:"image"`
				Ko    *struct {
					Main  string   `json:"main"`
					Env   []string `json:"env"`
					Flags []string `json:"flags"`
				} `json:"ko"`
			} `json:"artifacts"`
		} `json:"build"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("skaffold.yaml: %v", err)
	}
	for _, a := range cfg.Build.Artifacts {
		if a.Image == "v0m3" && a.Ko != nil {
			if a.Ko.Main != "./cmd/v0m3" {
				t.Fatalf("skaffold's v0m3 artifact builds %q, not ./cmd/v0m3", a.Ko.Main)
			}
			return a.Ko.Env, a.Ko.Flags
		}
	}
	t.Fatal("skaffold.yaml has no ko artifact for the v0m3 image")
	return nil, nil
}

// dynamic says why the ELF file at path needs a dynamic loader, or "".
func dynamic(t *testing.T, path string) string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var why []string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			why = append(why, "has an ELF interpreter")
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		why = append(why, "needs "+strings.Join(libs, ", "))
	}
	return strings.Join(why, "; ")
}
