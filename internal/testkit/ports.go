package testkit

import (
	"fmt"
	"math/rand/v2"
	"net"
	"testing"
)

// Ports below Linux's default ephemeral range (32768-60999): a port handed
// to a child process to listen on is chosen there, so no outgoing
// connection and no ":0" listener of a test running alongside can take it
// between its choice and the child's bind.
const (
	reservedLow  = 20000
	reservedHigh = 32767
)

// ListenLoopback returns a listener on a free loopback port below the
// ephemeral range, for a test to hold while it hands the address to a
// process it starts (closing it just before). A port chosen with ":0"
// comes from the ephemeral range, where anything connecting out meanwhile
// may be given it, and the child then fails with "address already in use".
func ListenLoopback(t testing.TB) net.Listener {
	t.Helper()
	var err error
	for range 100 {
		port := reservedLow + rand.IntN(reservedHigh-reservedLow+1)
		var l net.Listener
		if l, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			return l
		}
	}
	t.Fatalf("no free loopback port below the ephemeral range: %v", err)
	return nil
}

// FreeLoopbackAddr returns a loopback address below the ephemeral range
// that nobody listens on right now, for a process the test starts to
// listen on (see ListenLoopback).
func FreeLoopbackAddr(t testing.TB) string {
	t.Helper()
	l := ListenLoopback(t)
	defer l.Close()
	return l.Addr().String()
}
