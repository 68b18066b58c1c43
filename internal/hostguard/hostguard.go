// Package hostguard protects a local HTTP MCP endpoint against DNS
// rebinding: a browser tricked into sending requests to it under another
// site's name names that site in its Host (and Origin) header, which is
// refused here. The stdio bridge and the orchestrator's task endpoint
// share it, so the rule exists once.
package hostguard

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/v0m3/v0m3/internal/stranger"
)

// Hosts are the host names a request may name in its Host header and, when
// it sends one, its Origin. Loopback names and addresses are always
// allowed.
type Hosts struct {
	allowed map[string]bool
}

// New returns the allowed hosts: the names given (empty entries ignored,
// case-insensitive, brackets of IPv6 literals optional) plus loopback.
func New(names []string) Hosts {
	h := Hosts{allowed: map[string]bool{}}
	for _, n := range names {
		if n = strings.ToLower(strings.Trim(strings.TrimSpace(n), "[]")); n != "" {
			h.allowed[n] = true
		}
	}
	return h
}

// Allowed reports whether host (a Host header or URL host, with or without
// port) is allowed.
func (h Hosts) Allowed(host string) bool {
	if hh, _, err := net.SplitHostPort(host); err == nil {
		host = hh
	}
	host = strings.ToLower(strings.Trim(host, "[]"))
	if host == "localhost" || h.allowed[host] {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// Check refuses a request whose Host or Origin names another site. The
// error quotes them clipped (stranger.Clip): a stranger chose them.
func (h Hosts) Check(r *http.Request) error {
	if !h.Allowed(r.Host) {
		return fmt.Errorf("host %q is not allowed", stranger.Clip(r.Host))
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil // not a browser, or a same-origin GET
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || !h.Allowed(u.Host) {
		return fmt.Errorf("origin %q is not allowed", stranger.Clip(origin))
	}
	return nil
}
