// Command probe tries one TCP connection from inside a pod, for the
// real-node NetworkPolicy tests: it waits (so the policy enforcer has seen
// the pod's address), dials, prints what happened and exits 0 when the
// connection opened, 1 when it did not.
//
//	probe [-wait 5s] [-timeout 3s] HOST:PORT
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"time"
)

func main() {
	wait := flag.Duration("wait", 5*time.Second, "pause before dialing")
	timeout := flag.Duration("timeout", 3*time.Second, "dial timeout")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: probe [-wait D] [-timeout D] HOST:PORT")
		os.Exit(2)
	}
	time.Sleep(*wait)
	c, err := net.DialTimeout("tcp", flag.Arg(0), *timeout)
	if err != nil {
		fmt.Println("blocked:", err)
		os.Exit(1)
	}
	c.Close()
	fmt.Println("open")
}
