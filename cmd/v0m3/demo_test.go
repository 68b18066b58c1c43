package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/v0m3/v0m3/internal/testkit"
)

// rawLogLine matches a structured log line (slog's JSON or text form).
var rawLogLine = regexp.MustCompile(`"level":|\blevel=|"time":|\btime=`)

// `v0m3 demo`, run the way `make demo` runs it, tells its story on the
// terminal with no log line in it: stdout holds only the story and stderr
// nothing, while the services' log goes to v0m3.log in the data directory
// (it holds the WARN for the caller the story shows refused without a
// token). The story ends saying where the data and the log went and what
// to try next.
func TestDemoStory(t *testing.T) {
	t.Parallel()
	bins, cleanup, err := testkit.BuildBinaries("github.com/v0m3/v0m3/cmd/v0m3")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	dir := filepath.Join(t.TempDir(), "demo-data")
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bins[0], "demo", "--data-dir", dir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("v0m3 demo: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	story := stdout.String()
	for _, l := range strings.Split(story, "\n") {
		if rawLogLine.MatchString(l) {
			t.Errorf("a log line in the demo's story: %s", l)
		}
	}
	if stderr.Len() != 0 {
		t.Errorf("the demo wrote to stderr (the terminal shows it inside the story):\n%s", stderr.String())
	}

	logPath := filepath.Join(dir, "v0m3.log")
	log, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatalf("the services' log: %v", err)
	}
	if !bytes.Contains(log, []byte(`"level":"WARN"`)) || !bytes.Contains(log, []byte(`"reason":"CREDENTIALS_MISSING"`)) {
		t.Errorf("%s lacks the refused anonymous call's WARN line:\n%s", logPath, log)
	}

	// The story's stages come first, then where it went, then what next,
	// which ends it.
	complete := strings.Index(story, "demo complete:")
	where := strings.Index(story, "\nwhere it went:\n")
	next := strings.Index(story, "\nnext:\n")
	if complete < 0 || where < complete || next < where {
		t.Fatalf("the story does not end with where it went and what next, in that order:\n%s", story)
	}
	for _, want := range []string{"data:         " + dir, "service log:  " + logPath, "rm -rf " + dir} {
		if !strings.Contains(story[where:next], want) {
			t.Errorf("where it went lacks %q:\n%s", want, story[where:next])
		}
	}
	var firsts []string
	for _, l := range strings.Split(strings.TrimSpace(story[next:]), "\n")[1:] {
		firsts = append(firsts, strings.Fields(l)[0])
	}
	if got, want := strings.Join(firsts, " "), "make scripts/walkthrough.sh README.md"; got != want {
		t.Errorf("next steps start %q, want %q (make run, the walkthrough, the docs):\n%s", got, want, story[next:])
	}
	if !strings.Contains(story[next:], "docs/") {
		t.Errorf("next steps do not point to docs/:\n%s", story[next:])
	}
}
