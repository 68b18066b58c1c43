package e2e_test

import (
	"bufio"
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/serve"
	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/suite"
)

// startDev runs `v0m3 dev` as a separate process on ephemeral ports with
// the given store, and returns clients for its services (TLS trusting the
// CA it made) with the development issuer it accepts tokens from.
func startDev(t *testing.T, store string) stack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dataDir := t.TempDir()
	cmd := exec.CommandContext(ctx, v0m3Bin, "dev", "--port-base", "0", "--data-dir", dataDir, "--store", store, "--log-level", "warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	// A process that never prints its addresses is killed, which ends
	// the scan, rather than hanging the package.
	scanDeadline := time.AfterFunc(2*time.Minute, cancel)
	addrs := map[string]string{}
	sc := bufio.NewScanner(stdout)
	re := regexp.MustCompile(`^\s+(\w+)\s+(\S+:\d+)$`)
	for len(addrs) < len(suite.Names) && sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			addrs[m[1]] = m[2]
		}
	}
	scanDeadline.Stop()
	go func() {
		for sc.Scan() {
		}
	}()
	roots := devRoots(t, dataDir)
	iss, err := identity.LoadDevIssuer(filepath.Join(dataDir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	dial := func(name string) *grpc.ClientConn {
		if addrs[name] == "" {
			t.Fatalf("v0m3 dev did not print the %s address", name)
		}
		c, err := serve.Dial(addrs[name], identity.CallerDialOptions(roots)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	return stack{
		Clients:   suite.NewClients(dial(suite.Registry), dial(suite.Policy), dial(suite.Evidence), dial(suite.Adapter), dial(suite.Orchestrator)),
		DevIssuer: iss,
	}
}

// TestTwoProcessesOneRedis runs two separate `v0m3 dev` processes against
// one Redis. The scenario runs through the first; then both receive the same
// provider call at once: one intent, and one call reaches the server.
func TestTwoProcessesOneRedis(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	store := "redis://" + addr + "/0?prefix=" + redistest.Prefix(t)
	a, b := startDev(t, store), startDev(t, store)
	ctx := context.Background()

	logPath := filepath.Join(testkit.WritableDir(t), "calls.jsonl")
	r, err := scenario.Run(ctx, a.Clients, scenario.Config{Transport: scenario.StdioFixture(v0m3Bin, "--call-log", logPath), As: a.As})
	if err != nil {
		t.Fatalf("scenario through the first process: %v", err)
	}
	before := toolCalls(callLog(t, logPath))

	// The second process sees the first one's task, catalogue and request.
	task := r.SourceTask.GetTask().GetId()
	if got, err := b.Orchestrator.GetRequest(testkit.As(b, scenario.Alice), &orchestratorv1.GetRequestRequest{Id: r.Retrieval.GetId()}); err != nil || got.GetIntentId() != r.Retrieval.GetIntentId() {
		t.Fatalf("the second process reads request %s as %v (%v)", r.Retrieval.GetId(), got, err)
	}

	args := r.Retrieval.GetArguments()
	var wg sync.WaitGroup
	results := make([]*orchestratorv1.ToolRequest, 2)
	errs := make([]error, 2)
	for i, c := range []stack{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = c.Orchestrator.SubmitToolRequest(testkit.As(c, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
				TaskId: task, ProviderCallId: "call-replicated", Capability: scenario.Retrieve, Arguments: args,
			})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("process %d: %v", i+1, err)
		}
	}
	if results[0].GetIntentId() == "" || results[0].GetIntentId() != results[1].GetIntentId() || results[0].GetId() != results[1].GetId() {
		t.Fatalf("two processes created two intents: %s / %s", results[0].GetIntentId(), results[1].GetIntentId())
	}
	// One of the two executed it; the other returned the same request,
	// so the server was asked once.
	final, err := a.Orchestrator.GetRequest(testkit.As(a, scenario.Alice), &orchestratorv1.GetRequestRequest{Id: results[0].GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(final.GetAttempts()); n != 1 {
		t.Errorf("the replicated call has %d attempts, want 1", n)
	}
	if n := toolCalls(callLog(t, logPath)) - before; n != 1 {
		t.Errorf("the replicated call reached the server %d times, want 1", n)
	}
}
