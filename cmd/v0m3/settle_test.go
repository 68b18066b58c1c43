package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/suite"
)

// `v0m3 settle` calls SettleRequest as the person whose token it carries:
// the orchestrator's answer (refusal by policy, a request that does not
// exist, a field at fault) comes back with its reason; a command line that
// does not say what was established is refused before any call.
func TestSettleCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	run := func(groups string, args ...string) (string, error) {
		tok, err := s.Dev.Issuer.Mint("carol", strings.Split(groups, ","), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "--orchestrator-addr", s.Addr[suite.Orchestrator], "--token", tok, "--tls-ca-file", filepath.Join(dir, "pki", "ca.crt"))
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		err = runSettle(ctx, args, &out, &bytes.Buffer{})
		return out.String(), err
	}
	for _, tc := range []struct {
		name   string
		groups string
		args   []string
		usage  bool
		want   string
	}{
		{"neither executed nor not", "settler", []string{"req_1", "--attempt", "att_1", "--note", "n"}, true, "--executed or --not-executed"},
		{"both", "settler", []string{"req_1", "--attempt", "att_1", "--executed", "--not-executed", "--note", "n"}, true, "--executed or --not-executed"},
		{"no request id", "settler", []string{"--attempt", "att_1", "--not-executed", "--note", "n"}, true, "one request id"},
		{"executed without evidence", "settler", []string{"req_1", "--attempt", "att_1", "--executed", "--note", "n"}, false, "SETTLEMENT_EVIDENCE_REQUIRED"},
		{"a request that does not exist", "settler", []string{"req_missing", "--attempt", "att_1", "--not-executed", "--note", "n"}, false, "REQUEST_UNKNOWN"},
		{"list with a request id", "settler", []string{"req_1", "--list"}, true, "--list takes no request id"},
		{"list and settle", "settler", []string{"--list", "--not-executed"}, true, "--list takes no request id"},
	} {
		out, err := run(tc.groups, tc.args...)
		var ue usageError
		if err == nil || errors.As(err, &ue) != tc.usage || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tc.want)) {
			t.Errorf("%s: out %q, error %v; want a %s error naming %q", tc.name, out, err, map[bool]string{true: "usage", false: "call"}[tc.usage], tc.want)
		}
	}
	// --list reads across every task what the caller may settle.
	if out, err := run("settler", "--list"); err != nil || !strings.Contains(out, "no request you may settle awaits settlement") {
		t.Errorf("settle --list on a store with nothing unknown: %q, %v", out, err)
	}
}

// pagedRequests answers ListRequests with its pages in turn, checking that
// each asks across every task for what awaits settlement.
type pagedRequests struct {
	orchestratorv1.OrchestratorServiceClient
	t     *testing.T
	pages [][]*orchestratorv1.ToolRequest
}

func (p *pagedRequests) ListRequests(_ context.Context, in *orchestratorv1.ListRequestsRequest, _ ...grpc.CallOption) (*orchestratorv1.ListRequestsResponse, error) {
	if in.GetTaskId() != "-" || !in.GetAwaitingSettlement() {
		p.t.Errorf("ListRequests(%v): want every task's requests awaiting settlement", in)
	}
	i := 0
	if in.GetPageToken() != "" {
		i, _ = strconv.Atoi(in.GetPageToken())
	}
	resp := &orchestratorv1.ListRequestsResponse{Requests: p.pages[i]}
	if i+1 < len(p.pages) {
		resp.NextPageToken = strconv.Itoa(i + 1)
	}
	return resp, nil
}

// `v0m3 settle --list` prints every page: each request with the attempt
// to examine, its task, capability and since when its outcome is unknown.
func TestSettleListPrintsEveryPage(t *testing.T) {
	t.Parallel()
	unknown := func(id, task string, ended time.Time) *orchestratorv1.ToolRequest {
		return &orchestratorv1.ToolRequest{Id: id, TaskId: task, Capability: "render_preview", Attempts: []*orchestratorv1.Attempt{
			{Id: id + "_att_1", EndTime: timestamppb.New(ended.Add(-time.Hour))}, {Id: id + "_att_2", EndTime: timestamppb.New(ended)}}}
	}
	at := time.Date(2026, 12, 7, 4, 5, 6, 0, time.UTC)
	var out bytes.Buffer
	err := listAwaitingSettlement(t.Context(), &pagedRequests{t: t, pages: [][]*orchestratorv1.ToolRequest{
		{unknown("req_1", "task_a", at)}, {unknown("req_2", "task_b", at.Add(time.Minute))},
	}}, &out)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := [][]string{
		{"REQUEST", "ATTEMPT", "TASK", "CAPABILITY", "UNKNOWN", "SINCE"},
		{"req_1", "req_1_att_2", "task_a", "render_preview", "2026-12-07T04:05:06Z"},
		{"req_2", "req_2_att_2", "task_b", "render_preview", "2026-12-07T04:06:06Z"},
	}
	if len(lines) != len(want) {
		t.Fatalf("output:\n%s\nwant %d lines", out.String(), len(want))
	}
	for i, l := range lines {
		if got := strings.Fields(l); !slices.Equal(got, want[i]) {
			t.Errorf("line %d = %q, want %q", i, got, want[i])
		}
	}
}
