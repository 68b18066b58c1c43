package adapter

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Execute uses its own earlier reading of a connection only when the
// caller's reading, made when it authorized the call, has the same digest;
// any other digest, or none, and it asks the registry. A connection the
// registry shows retired is refused, and its earlier reading is not used
// again even under its old digest.
func TestExecuteUsesTheCallersReading(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn := e.httpConn(httpURL)
	read, err := digest.Message(conn)
	if err != nil {
		t.Fatal(err)
	}
	retired := proto.CloneOf(conn)
	retired.State = registryv1.ConnectionState_CONNECTION_STATE_RETIRED
	retiredDigest, err := digest.Message(retired)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name   string
		before func()
		digest string
		reads  int64  // GetConnection calls the step makes
		reason string // the refusal's reason, "" for a call that ran
	}{
		{"first call: nothing read yet", nil, read, 1, ""},
		{"the caller's reading matches the adapter's", nil, read, 0, ""},
		{"no digest", nil, "", 1, ""},
		{"another digest", nil, digest.Bytes([]byte("another state")), 1, ""},
		{"matches again", nil, read, 0, ""},
		{"retired, as the caller read it", func() { e.registry.add(proto.CloneOf(retired)) }, retiredDigest, 1, "CONNECTION_RETIRED"},
		{"the old reading is gone", nil, read, 1, "CONNECTION_RETIRED"},
	} {
		if step.before != nil {
			step.before()
		}
		before := e.registry.gets.Load()
		req := call(t, conn, "search", map[string]any{"query": "Retry-After"}, nil)
		req.ConnectionDigest = step.digest
		resp, err := e.srv.Execute(context.Background(), granted(t, req))
		if got := e.registry.gets.Load() - before; got != step.reads {
			t.Errorf("%s: %d registry reads, want %d", step.name, got, step.reads)
		}
		switch {
		case step.reason != "":
			if !apierror.Is(err, codes.FailedPrecondition, step.reason) {
				t.Errorf("%s: Execute = %v, %v; want %s", step.name, resp.GetOutcome(), err, step.reason)
			}
		case err != nil || resp.GetError() != nil:
			t.Errorf("%s: Execute = %v (%s), %v; want a result", step.name, resp.GetOutcome(), resp.GetError().GetSafeCode(), err)
		}
	}
}
