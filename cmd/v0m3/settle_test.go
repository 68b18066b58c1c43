package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/v0m3/v0m3/services/suite"
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
	} {
		out, err := run(tc.groups, tc.args...)
		var ue usageError
		if err == nil || errors.As(err, &ue) != tc.usage || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tc.want)) {
			t.Errorf("%s: out %q, error %v; want a %s error naming %q", tc.name, out, err, map[bool]string{true: "usage", false: "call"}[tc.usage], tc.want)
		}
	}
}
