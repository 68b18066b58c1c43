// Command v0m3 is the single V0M3 Boundary binary: each service, the
// all-in-one dev mode, the fixture MCP server and CLI verbs.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "v0m3: under construction")
	os.Exit(2)
}
