package docs_test

import (
	"regexp"
	"strings"
	"testing"
)

var (
	submitted = regexp.MustCompile(`(?m)^  submit: .*request (req_[A-Za-z0-9_-]+)`)
	traceLine = regexp.MustCompile(`(?m)^    #\d+ (?:product|protocol) .*$`)
)

// requestsAndTraces returns the requests the walkthrough submitted and,
// for each, the trace lines it printed after the submission (up to the
// next submission).
func requestsAndTraces(out string) map[string][]string {
	got := map[string][]string{}
	subs := submitted.FindAllStringSubmatchIndex(out, -1)
	for i, s := range subs {
		end := len(out)
		if i+1 < len(subs) {
			end = subs[i+1][0]
		}
		got[out[s[2]:s[3]]] = traceLine.FindAllString(out[s[1]:end], -1)
	}
	return got
}

// scripts/walkthrough.sh runs every step against a real `v0m3 dev`,
// capturing the ids itself: both acts complete, each submitted request is
// named in the trace the script printed, Act 2's request waited for a
// person and was executed once approved.
func TestWalkthrough(t *testing.T) {
	requireTool(t, "jq", "the walkthrough reads answers with jq")
	out, err := walkthrough()
	if err != nil {
		t.Fatalf("%v\n%s", err, dev.logTail())
	}
	t.Logf("scripts/walkthrough.sh printed:\n%s", out)
	reqs := requestsAndTraces(out)
	if len(reqs) != 2 {
		t.Fatalf("the walkthrough submitted %d requests, want 2 (a retrieval, a preview)", len(reqs))
	}
	for req, trace := range reqs {
		named := false
		for _, l := range trace {
			named = named || strings.Contains(l, " "+req+" ")
		}
		if !named {
			t.Errorf("the trace printed after submitting %s does not name it:\n%s", req, strings.Join(trace, "\n"))
		}
	}
	for _, want := range []string{
		"is REQUEST_STATE_EXECUTED (a retrieval needs no approval)",
		"waits for a person: \"Render preview of document revision 31 using profile 4\"",
		"approved it: REQUEST_STATE_EXECUTED",
		"\n  result:   alice reads req_",
		"\ndone: task task_",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the walkthrough's output lacks %q", want)
		}
	}
}

// Running the walkthrough again against the same instance reuses the
// connections and mappings the first run made, and still completes.
func TestWalkthroughRerun(t *testing.T) {
	requireTool(t, "jq", "the walkthrough reads answers with jq")
	if _, err := walkthrough(); err != nil {
		t.Fatalf("first run: %v", err)
	}
	out, err := runWalkthrough(dev.env())
	if err != nil {
		t.Fatalf("second run: %v\n%s", err, dev.logTail())
	}
	if n := strings.Count(out, "(reusing it)"); n != 4 {
		t.Errorf("the second run reused %d connections and mappings, want 4 (two of each):\n%s", n, out)
	}
	if strings.Contains(out, "integrator proposed") || strings.Contains(out, "awaiting review") {
		t.Errorf("the second run created a connection or proposed a mapping again:\n%s", out)
	}
	if len(requestsAndTraces(out)) != 2 {
		t.Errorf("the second run did not submit its two requests:\n%s", out)
	}
}

// Without a `v0m3 dev` to talk to, the walkthrough stops at once and says
// what to start.
func TestWalkthroughNoDev(t *testing.T) {
	requireTool(t, "jq", "the walkthrough reads answers with jq")
	env := append(dev.env(), "V0M3_ORCHESTRATOR_ADDR=127.0.0.1:1")
	out, err := runWalkthrough(env)
	if err == nil {
		t.Fatalf("the walkthrough succeeded against 127.0.0.1:1:\n%s", out)
	}
	for _, want := range []string{"v0m3 dev is not reachable at 127.0.0.1:1", "make run"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refusal lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Act 1") {
		t.Errorf("the walkthrough started its steps without a dev instance:\n%s", out)
	}
}
