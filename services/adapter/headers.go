package adapter

import (
	"context"
	"time"
)

// headerListTimeout bounds listing a new session's tools for their
// header declarations.
const headerListTimeout = 10 * time.Second

// primeToolHeaders lists the tools of a new pooled session that speaks
// 2026-07-28 or later, once, so that the client library sends with each
// tools/call the Mcp-Param-* headers the tool's input schema declares
// (x-mcp-header): from that version on, a server may route or refuse a
// call by them. The headers repeat argument values the request body
// already carries to the same server; the client library refuses a tool
// whose declarations are malformed and encodes values that are not safe
// header text. Earlier versions have no such headers, and a server
// without tools has nothing to declare: nothing is listed then. A
// failure is logged; calls then go without the headers.
func (ss *session) primeToolHeaders(ctx context.Context) {
	init := ss.cs.InitializeResult()
	if init == nil || init.ProtocolVersion < statelessVersion || init.Capabilities == nil || init.Capabilities.Tools == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, headerListTimeout)
	defer cancel()
	lim := ss.m.register("tools/list", "", discoveryMessageLimit)
	defer ss.m.unregister(lim)
	n := 0
	for _, err := range ss.cs.Tools(ctx, nil) {
		if err != nil {
			ss.srv.log.Warn("listing a new session's tools for their headers failed; calls go without Mcp-Param headers",
				"connection_id", ss.connectionID, "error", logText(ss.creds.err(err)))
			return
		}
		if n++; n >= maxListedItems {
			return
		}
	}
}
