// Command escapecmd runs the hostile escape server (package escape) over
// stdio for the adapter's sandbox tests. Its flags are ignored: they only
// mark the process (e.g. --name=victim) so a test can find it.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/v0m3/v0m3/services/adapter/internal/escape"
)

func main() {
	err := escape.NewServer().Run(context.Background(), &mcp.StdioTransport{})
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
