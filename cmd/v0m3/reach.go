package main

import (
	"flag"
	"strings"
	"time"

	"github.com/v0m3/v0m3/services/adapter"
	"github.com/v0m3/v0m3/suite"
)

// reachFlags say which MCP servers the adapter may start or reach, and
// how it keeps its sessions to them.
type reachFlags struct {
	roots          optionalList
	credRoots      optionalList
	loopback       *bool
	privateNetwork *bool
	maxCalls       *int
	idleTimeout    *time.Duration
}

// addReachFlags adds the adapter's reach flags; dev allows loopback by
// default (its fixtures listen there), a deployed adapter does not.
func addReachFlags(fs *flag.FlagSet, dev bool) *reachFlags {
	f := &reachFlags{}
	fs.Var(&f.roots, "stdio-roots", "comma-separated directories (or files) stdio executables must lie under; unset = this binary and ~/.cache/v0m3, empty = no stdio servers")
	fs.Var(&f.credRoots, "credential-roots", "comma-separated directories connections' credentials are read under, each connection's in <root>/<connection id>/; unset = <data-dir>/credentials, empty = none")
	f.loopback = fs.Bool("allow-loopback", dev, "let connections reach loopback addresses")
	f.privateNetwork = fs.Bool("allow-private-networks", false, "let connections reach private addresses (in-cluster MCP servers)")
	f.maxCalls = fs.Int("max-calls-per-connection", adapter.DefaultMaxCallsPerConnection, "calls one connection may have in flight on its MCP session; more wait for a slot until their deadline")
	f.idleTimeout = fs.Duration("session-idle-timeout", adapter.DefaultSessionIdleTimeout, "close an MCP session (and its local server process) unused this long")
	return f
}

// sessions is the adapter's session configuration.
func (f *reachFlags) sessions() adapter.SessionConfig {
	return adapter.SessionConfig{MaxCallsPerConnection: *f.maxCalls, IdleTimeout: *f.idleTimeout}
}

func (f *reachFlags) reach() *suite.Reach {
	return &suite.Reach{StdioRoots: f.roots.list, CredentialRoots: f.credRoots.list, AllowLoopback: *f.loopback, AllowPrivateNetworks: *f.privateNetwork}
}

// optionalList is a comma-separated flag that tells unset (nil) from
// empty.
type optionalList struct{ list []string }

func (l *optionalList) String() string { return strings.Join(l.list, ",") }

func (l *optionalList) Set(v string) error {
	l.list = []string{}
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			l.list = append(l.list, s)
		}
	}
	return nil
}
