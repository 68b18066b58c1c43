package evidence

// Fail points where the fault-injection tests crash or freeze a real
// evidence process (internal/failpoint: a binary built with the
// failpoints tag only).
const (
	// FailPointTraceBefore is before trace events are stored.
	FailPointTraceBefore = "evidence.trace.before"
	// FailPointTraceAfter is after trace events are stored, before the
	// caller learns it.
	FailPointTraceAfter = "evidence.trace.after"
	// FailPointReceiptBefore is before a receipt is stored.
	FailPointReceiptBefore = "evidence.receipt.before"
	// FailPointReceiptAfter is after a receipt is stored, before the
	// caller learns it.
	FailPointReceiptAfter = "evidence.receipt.after"
	// FailPointObservationAfter is after a source observation is stored,
	// before the caller learns it.
	FailPointObservationAfter = "evidence.observation.after"
)
