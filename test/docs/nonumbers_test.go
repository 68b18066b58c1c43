package docs_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Readers of the README, the docs and the CLI's help have no access to the
// team's tracker or to files beside the repository, so a reference to
// either is a dead end for them. These patterns catch what slipped in
// before: "issue 14", "stop 42", "#43", "../shared/DESIGN.md", "/work/...".
var nnPatterns = []struct {
	what string
	re   *regexp.Regexp
}{
	{"an internal issue number", regexp.MustCompile(`(?i)\bissues?\s+#?\d+`)},
	{"an internal stop number", regexp.MustCompile(`(?i)\bstops?\s+\d+\b`)},
	{"a bare tracker number", regexp.MustCompile(`(?m)(^|[\s(\[])#\d+\b`)},
	{"a path outside the repository", regexp.MustCompile(`\.\./shared\b|(^|[^\w.])/work/`)},
}

// nnFind returns one line per reference found in text.
func nnFind(text string) []string {
	var out []string
	for i, line := range strings.Split(text, "\n") {
		for _, r := range nnPatterns {
			if m := r.re.FindString(line); m != "" {
				out = append(out, strings.TrimSpace(m)+" ("+r.what+") on line "+strconv.Itoa(i+1)+": "+strings.TrimSpace(line))
			}
		}
	}
	return out
}

// nnRoot is the module root: this package lives in test/docs.
func nnRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found from %s: %v", root, err)
	}
	return root
}

// nnDocFiles returns README.md and every Markdown file under docs/.
func nnDocFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{filepath.Join(root, "README.md")}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// nnLink matches a Markdown link or image target: [text](target).
var nnLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// nnLinksOutside returns the relative link targets in the Markdown file at
// path (inside root) that lead out of the repository.
func nnLinksOutside(root, path, text string) []string {
	var out []string
	for _, m := range nnLink.FindAllStringSubmatch(text, -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "#") {
			continue
		}
		target, _, _ = strings.Cut(target, "#")
		var abs string
		if filepath.IsAbs(target) {
			abs = filepath.Clean(target)
		} else {
			abs = filepath.Join(filepath.Dir(path), target)
		}
		if rel, err := filepath.Rel(root, abs); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			out = append(out, m[1])
		}
	}
	return out
}

// TestDocsNameNoInternalReferences fails when README.md or a Markdown file
// under docs/ names an internal issue or stop number, or points at a file
// outside the repository.
func TestDocsNameNoInternalReferences(t *testing.T) {
	root := nnRoot(t)
	for _, path := range nnDocFiles(t, root) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, path)
		for _, f := range nnFind(string(b)) {
			t.Errorf("%s: %s", rel, f)
		}
		for _, l := range nnLinksOutside(root, path, string(b)) {
			t.Errorf("%s: link %q leads outside the repository", rel, l)
		}
	}
}

// TestCLIHelpNamesNoInternalReferences builds the v0m3 binary and reads
// its usage and every command's -h output, as a user would.
func TestCLIHelpNamesNoInternalReferences(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the v0m3 binary")
	}
	root := nnRoot(t)
	bin := filepath.Join(t.TempDir(), "v0m3")
	build := exec.Command("go", "build", "-o", bin, "./cmd/v0m3")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/v0m3: %v\n%s", err, out)
	}
	help := nnHelp(t, bin, "help")
	commands := nnCommands(help)
	if len(commands) < 10 {
		t.Fatalf("found only %d commands in 'v0m3 help'; has its format changed?\n%s", len(commands), help)
	}
	texts := map[string]string{"v0m3 help": help}
	for _, c := range commands {
		texts["v0m3 "+c+" -h"] = nnHelp(t, bin, c, "-h")
	}
	for _, verb := range []string{"apply", "list", "get", "deprecate"} {
		for _, c := range []string{"capability", "profile"} {
			texts["v0m3 "+c+" "+verb+" -h"] = nnHelp(t, bin, c, verb, "-h")
		}
	}
	for name, text := range texts {
		for _, f := range nnFind(text) {
			t.Errorf("%s: %s", name, f)
		}
	}
}

// nnHelp runs the binary with args in an empty directory, with no V0M3_*
// environment, and returns what it printed. Help exits 0 or 2; what
// matters is the text.
func nnHelp(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = t.TempDir()
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "V0M3_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run()
	if out.Len() == 0 {
		t.Fatalf("%s %s printed nothing", filepath.Base(bin), strings.Join(args, " "))
	}
	return out.String()
}

// nnCommandLine matches a command line of the usage: two spaces, the
// command, then at least one space and its description.
var nnCommandLine = regexp.MustCompile(`^  ([a-z][a-z-]*[a-z])\s+\S`)

// nnCommands returns the commands the usage text lists.
func nnCommands(usage string) []string {
	var out []string
	seen := map[string]bool{}
	for _, line := range strings.Split(usage, "\n") {
		if m := nnCommandLine.FindStringSubmatch(line); m != nil && m[1] != "v0m3" && !seen[m[1]] {
			seen[m[1]] = true
			out = append(out, m[1])
		}
	}
	return out
}

// TestInternalReferencePatterns holds the patterns to what they must and
// must not catch, so a loosened pattern cannot pass the tests above
// vacuously.
func TestInternalReferencePatterns(t *testing.T) {
	for _, s := range []string{
		"The product API follows the Google API design guide (issue 20).",
		"Issue 14 asks that a governed call cost little more",
		"## Issue 43's changes on the call's path (stop 42)",
		"see issues #12 and 13",
		"fixed in #43",
		"See `../shared/DESIGN.md` for the full vocabulary.",
		"read /work/shared/seed.md",
	} {
		if len(nnFind(s)) == 0 {
			t.Errorf("not caught: %q", s)
		}
	}
	for _, s := range []string{
		"the OIDC issuer signs tokens; 15 minutes later they expire",
		"a non-stop 24h period",
		"`/paths/0` or `/paths/-` (append)",
		"[Observability](#observability)",
		"sed -n 1,20p /etc/hosts; ls ./work/x",
	} {
		if f := nnFind(s); len(f) != 0 {
			t.Errorf("caught by mistake: %q: %v", s, f)
		}
	}
	root := "/repo"
	if got := nnLinksOutside(root, "/repo/docs/api.md", "[a](../README.md) [b](reference/errors.md) [c](https://x.example/y) [d](#x)"); len(got) != 0 {
		t.Errorf("links inside the repository reported: %v", got)
	}
	if got := nnLinksOutside(root, "/repo/README.md", "[design](../shared/DESIGN.md) and [x](docs/../../y.md)"); len(got) != 2 {
		t.Errorf("links outside the repository: got %v, want both", got)
	}
}
