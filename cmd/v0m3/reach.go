package main

import (
	"flag"
	"strings"

	"github.com/v0m3/v0m3/services/suite"
)

// reachFlags say which MCP servers the adapter may start or reach.
type reachFlags struct {
	roots          optionalList
	loopback       *bool
	privateNetwork *bool
}

// addReachFlags adds the adapter's reach flags; dev allows loopback by
// default (its fixtures listen there), a deployed adapter does not.
func addReachFlags(fs *flag.FlagSet, dev bool) *reachFlags {
	f := &reachFlags{}
	fs.Var(&f.roots, "stdio-roots", "comma-separated directories (or files) stdio executables must lie under; unset = this binary and ~/.cache/v0m3, empty = no stdio servers")
	f.loopback = fs.Bool("allow-loopback", dev, "let connections reach loopback addresses")
	f.privateNetwork = fs.Bool("allow-private-networks", false, "let connections reach private addresses (in-cluster MCP servers)")
	return f
}

func (f *reachFlags) reach() *suite.Reach {
	return &suite.Reach{StdioRoots: f.roots.list, AllowLoopback: *f.loopback, AllowPrivateNetworks: *f.privateNetwork}
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
