package docs_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// docFiles are the documents whose ```sh blocks run, as globs relative to
// the repository root, in this order (files a glob matches in name order).
var docFiles = []string{"README.md", "docs/*.md"}

// block is one ```sh fenced block of a document.
type block struct {
	file string // relative to the repository root
	line int    // of the opening fence, 1-based
	code string
	skip string // the reason of a "<!-- not run: reason -->" just before the fence
}

var (
	notRun = regexp.MustCompile(`^<!--\s*not run:\s*(\S.*?)\s*-->$`)
	fence  = regexp.MustCompile("^\\s*(```+|~~~+)\\s*([^`\\s]*)")
)

// shBlocks returns the ```sh blocks of a Markdown document, in order. A
// fence closes only with a fence of the same character at least as long,
// so a ```sh inside a longer fence (an example of Markdown) is not a block.
func shBlocks(file, text string) ([]block, error) {
	var (
		blocks []block
		open   string // the opening fence's marker, "" outside a fence
		cur    *block
		body   []string
	)
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		m := fence.FindStringSubmatch(l)
		if open == "" {
			if m == nil {
				continue
			}
			open = m[1]
			if m[2] == "sh" {
				cur, body = &block{file: file, line: i + 1}, nil
				if i > 0 {
					if r := notRun.FindStringSubmatch(strings.TrimSpace(lines[i-1])); r != nil {
						cur.skip = r[1]
					}
				}
			}
			continue
		}
		if m != nil && m[2] == "" && m[1][0] == open[0] && len(m[1]) >= len(open) {
			if cur != nil {
				cur.code = strings.Join(body, "\n") + "\n"
				blocks = append(blocks, *cur)
			}
			open, cur = "", nil
			continue
		}
		if cur != nil {
			body = append(body, l)
		}
	}
	if open != "" {
		return blocks, fmt.Errorf("%s: a fence opened is never closed", file)
	}
	return blocks, nil
}

// The extractor finds exactly the sh blocks, with the line of their fence
// and the reason of a not-run mark on the line just before it.
func TestShBlocks(t *testing.T) {
	doc := strings.Join([]string{
		"# Title",                           // 1
		"```sh",                             // 2
		"echo one",                          // 3
		"```",                               // 4
		"<!-- not run: needs a cluster -->", // 5
		"```sh",                             // 6
		"kubectl apply -f x",                // 7
		"```",                               // 8
		"<!-- not run: too early -->",       // 9
		"",                                  // 10: not immediately before
		"```sh",                             // 11
		"echo three",                        // 12
		"```",                               // 13
		"````markdown",                      // 14
		"```sh",                             // 15: inside a longer fence
		"echo never",                        // 16
		"```",                               // 17
		"````",                              // 18
		"```go",                             // 19
		"fmt.Println()",                     // 20
		"```",                               // 21
		"```sh",                             // 22
		"echo four",                         // 23
		"echo five",                         // 24
		"```",                               // 25
	}, "\n")
	got, err := shBlocks("x.md", doc)
	if err != nil {
		t.Fatal(err)
	}
	want := []block{
		{"x.md", 2, "echo one\n", ""},
		{"x.md", 6, "kubectl apply -f x\n", "needs a cluster"},
		{"x.md", 11, "echo three\n", ""},
		{"x.md", 22, "echo four\necho five\n", ""},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("blocks = %+v\nwant %+v", got, want)
	}
	if _, err := shBlocks("y.md", "```sh\necho\n"); err == nil {
		t.Error("an unclosed fence was accepted")
	}
}

// Every ```sh block of README.md and docs/*.md runs against the test's
// `v0m3 dev`, in file order, unless marked not run; the first failing block
// fails the test, named by file and line.
func TestDocBlocks(t *testing.T) {
	for _, pattern := range docFiles {
		files, err := filepath.Glob(filepath.Join(dev.repo, pattern))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Errorf("no document matches %s", pattern)
		}
		slices.Sort(files)
		for _, f := range files {
			rel, _ := filepath.Rel(dev.repo, f)
			t.Run(rel, func(t *testing.T) { runBlocks(t, rel) })
		}
	}
}

// runBlocks runs a document's blocks in one bash session, each sourced in
// turn, and fails naming the block that failed.
func runBlocks(t *testing.T, rel string) {
	text, err := os.ReadFile(filepath.Join(dev.repo, rel))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := shBlocks(rel, string(text))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	status := filepath.Join(dir, "status")
	var session strings.Builder
	session.WriteString("set -eo pipefail\n")
	ran := 0
	for i, b := range blocks {
		if b.skip != "" {
			t.Logf("%s:%d: not run: %s", b.file, b.line, b.skip)
			continue
		}
		name := filepath.Join(dir, "block-"+strconv.Itoa(i)+".sh")
		if err := os.WriteFile(name, []byte(b.code), 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&session, "echo %d >%q\necho %q\nsource %q\n", b.line, status, fmt.Sprintf("### %s:%d", b.file, b.line), name)
		ran++
	}
	fmt.Fprintf(&session, "echo done >%q\n", status)
	if ran == 0 {
		t.Logf("%s: no block to run", rel)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", session.String())
	cmd.Dir = dev.scratch
	cmd.Env = dev.env()
	cmd.WaitDelay = 10 * time.Second // a command a block left running must not hold the test
	out, runErr := cmd.CombinedOutput()
	last, _ := os.ReadFile(status)
	if st := strings.TrimSpace(string(last)); runErr != nil || st != "done" {
		t.Fatalf("%s:%s: the block starting at this line failed (%v); blocks of %s run in one bash session, the output so far:\n%s",
			rel, st, runErr, rel, out)
	}
	t.Logf("%s: %d blocks ran:\n%s", rel, ran, out)
}
