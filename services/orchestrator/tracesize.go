package orchestrator

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// Trace events travel in messages well under the 4 MiB gRPC default: one
// event's free-form detail is bounded, and a flush is split into batches.
const (
	// maxTraceDetail bounds a product event's detail, which may quote
	// untrusted text; a longer one is cut with a marker saying so.
	maxTraceDetail = 64 << 10
	// maxTraceBatchBytes bounds one AppendTraces message.
	maxTraceBatchBytes = 1 << 20
)

// boundTraceEvent cuts an oversized detail of te, saying how much was cut.
func boundTraceEvent(te *evidencev1.TraceEvent) {
	p := te.GetProduct()
	if p == nil || len(p.GetDetail()) <= maxTraceDetail {
		return
	}
	kept := truncate(p.GetDetail(), maxTraceDetail)
	p.Detail = kept + fmt.Sprintf(" …[truncated: %d more bytes]", len(p.GetDetail())-len(kept))
}

// traceBatches bounds each event and splits evs, in order, into batches of
// at most maxTraceBatchBytes (an event alone is always a batch).
func traceBatches(evs []*evidencev1.TraceEvent) [][]*evidencev1.TraceEvent {
	var (
		out  [][]*evidencev1.TraceEvent
		cur  []*evidencev1.TraceEvent
		size int
	)
	for _, ev := range evs {
		boundTraceEvent(ev)
		n := proto.Size(ev)
		if len(cur) > 0 && size+n > maxTraceBatchBytes {
			out, cur, size = append(out, cur), nil, 0
		}
		cur = append(cur, ev)
		size += n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}
