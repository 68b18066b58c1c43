package orchestrator

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/bounds"
	"github.com/v0m3/v0m3/internal/tracesend"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// Trace events travel in messages well under the 4 MiB gRPC default: one
// event's free-form detail is bounded, and a flush is split into batches.
const (
	// maxTraceDetail bounds a product event's detail, which may quote
	// untrusted text; a longer one is cut with a marker saying so, the
	// marker included, so evidence (which refuses a longer detail) takes
	// it.
	maxTraceDetail = bounds.Long
	// maxTraceBatchBytes bounds one AppendTraces message.
	maxTraceBatchBytes = tracesend.MaxBytes
)

// boundTraceEvent cuts an oversized detail of te, saying how much was cut.
func boundTraceEvent(te *evidencev1.TraceEvent) {
	p := te.GetProduct()
	if p == nil || len(p.GetDetail()) <= maxTraceDetail {
		return
	}
	// The marker for the whole length is at least as long as the one
	// written, so room for it is room enough.
	room := maxTraceDetail - len(truncationMarker(len(p.GetDetail())))
	kept := truncate(p.GetDetail(), room)
	p.Detail = kept + truncationMarker(len(p.GetDetail())-len(kept))
}

// truncationMarker says how many bytes of a detail were cut.
func truncationMarker(n int) string {
	return fmt.Sprintf(" …[truncated: %d more bytes]", n)
}

// traceBatches bounds each event and splits evs, in order, into batches of
// at most maxTraceBatchBytes (an event alone is always a batch) and
// tracesend.MaxEvents events, what one AppendTraces may carry: a longer
// batch would be refused whole and then sent one event at a time.
func traceBatches(evs []*evidencev1.TraceEvent) [][]*evidencev1.TraceEvent {
	var (
		out  [][]*evidencev1.TraceEvent
		cur  []*evidencev1.TraceEvent
		size int
	)
	for _, ev := range evs {
		boundTraceEvent(ev)
		n := proto.Size(ev)
		if len(cur) > 0 && (size+n > maxTraceBatchBytes || len(cur) == tracesend.MaxEvents) {
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
