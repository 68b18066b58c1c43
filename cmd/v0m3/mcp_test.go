package main

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// `v0m3 dev` serves the task MCP endpoints (TLS with the orchestrator's
// certificate, trusted through the development CA) and says where;
// --mcp-addr off turns them off.
func TestDevServesTaskMCP(t *testing.T) {
	t.Parallel()
	out := startDev(t)
	m := regexp.MustCompile(`task MCP\s+(https://\S+)/tasks/<task_id>/mcp`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("v0m3 dev did not say where task MCP endpoints are:\n%s", out)
	}
	ca := regexp.MustCompile(`TLS: trust (\S+)`).FindStringSubmatch(out)
	if ca == nil {
		t.Fatalf("no CA in:\n%s", out)
	}
	pem, err := os.ReadFile(filepath.Clean(ca[1]))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	c := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}}}
	resp, err := c.Post(m[1]+"/tasks/task_x/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer ") {
		t.Errorf("tools/list without a token = %d (%q); want 401 with a bearer challenge", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	if out := startDev(t, "--mcp-addr", "off"); strings.Contains(out, "task MCP") {
		t.Errorf("v0m3 dev --mcp-addr off serves task MCP endpoints:\n%s", out)
	}
}
