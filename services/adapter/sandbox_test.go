package adapter

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/fixture"
)

func textOf(t *testing.T, resp *adapterv1.ExecuteResponse) string {
	t.Helper()
	if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || len(resp.GetItems()) != 1 {
		t.Fatalf("outcome %v error %v items %d", resp.GetOutcome(), resp.GetError(), len(resp.GetItems()))
	}
	return resp.GetItems()[0].GetText()
}

// TestSandboxAppliedAndRecorded starts a local server, has it try to reach a
// loopback listener of the test, and checks that what the connection
// records is what the server lived under.
func TestSandboxAppliedAndRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn := e.stdioConn("--hostile")

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	dialed := textOf(t, execute(t, e, call(t, conn, "dial", map[string]any{"address": lis.Addr().String()}, nil)))
	_ = lis.Close()

	got, err := e.registry.GetConnection(context.Background(), &registryv1.GetConnectionRequest{Id: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	sb := got.GetSandbox()
	if sb.GetWorkingDir() != filepath.Join(e.srv.workDir, conn.GetId()) || !sb.GetMinimalEnvironment() {
		t.Errorf("sandbox = %v", sb)
	}
	for _, want := range []string{"RLIMIT_AS=2GiB", "RLIMIT_NOFILE=256", "RLIMIT_FSIZE=64MiB", "RLIMIT_CPU=600s"} {
		if !slices.Contains(sb.GetResourceLimits(), want) {
			t.Errorf("resource limits %v lack %s", sb.GetResourceLimits(), want)
		}
	}
	switch sb.GetNetwork() {
	case registryv1.NetworkIsolation_NETWORK_ISOLATION_ENFORCED:
		if dialed != fixture.DialFailed || accepted.Load() != 0 {
			t.Errorf("network isolation recorded as enforced, but the server's dial %s and the listener accepted %d", dialed, accepted.Load())
		}
	case registryv1.NetworkIsolation_NETWORK_ISOLATION_NOT_ENFORCED:
		t.Log("!!! the kernel refused a network namespace here: checking that the record says so truthfully")
		if dialed != fixture.DialConnected {
			t.Errorf("isolation recorded as not enforced, yet the server could not dial: %s", dialed)
		}
	default:
		t.Errorf("network isolation = %v", sb.GetNetwork())
	}

	// The limits are the process's own, not just a record.
	limits := textOf(t, execute(t, e, call(t, conn, "limits", map[string]any{}, nil)))
	for _, want := range []string{"Max open files            256                  256", "Max address space         2147483648           2147483648"} {
		if !strings.Contains(limits, want) {
			t.Errorf("/proc/self/limits of the server lacks %q:\n%s", want, limits)
		}
	}
}
