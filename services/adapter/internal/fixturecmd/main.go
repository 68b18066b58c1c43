// Command fixturecmd runs the "V0M3 Sources" fixture MCP server for the
// adapter's tests, over stdio or streamable HTTP, or (with --raw) one of
// the fixture's hand-written protocol-breaking servers over stdio.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/v0m3/v0m3/demo/fixture"
)

func main() {
	var (
		transport   = flag.String("transport", "stdio", `"stdio" or "http"`)
		addr        = flag.String("addr", "127.0.0.1:0", "listen address for http")
		schema      = flag.String("schema", "v1", `search schema, "v1" or "v2"`)
		description = flag.String("description", "default", `search description, "default" or "private"`)
		revision    = flag.Int("notes-revision", 1, "notes revision, 1 or 2")
		callLog     = flag.String("call-log", "", "file receiving one JSON line per request")
		hostile     = flag.Bool("hostile", false, "add the misbehaving test tools")
		redescribe  = flag.Int("redescribe-after-calls", 0, "change the search tool's description after this many search calls (sends tools/list_changed)")
		raw         = flag.String("raw", "", "serve a hand-written, protocol-breaking server over stdio instead: one of fixture.RawModes")
		banner      = flag.Int("banner", 0, "print this many non-JSON lines (the last one 100 KB long) on stdout before serving, as some community servers do")
	)
	flag.Parse()
	for i := 1; i <= *banner; i++ {
		line := fmt.Sprintf("fixture banner line %d of %d", i, *banner)
		if i == *banner {
			line += " " + strings.Repeat("x", 100<<10)
		}
		fmt.Println(line)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *raw != "" {
		if err := fixture.RunRaw(ctx, *raw, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	opts := fixture.Options{Schema: *schema, Description: *description, NotesRevision: *revision, CallLog: *callLog, Hostile: *hostile, RedescribeAfterCalls: *redescribe}
	if err := fixture.Run(ctx, opts, *transport, *addr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
