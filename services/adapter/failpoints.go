package adapter

// Fail points where the fault-injection tests crash or freeze a real
// adapter process (internal/failpoint: a binary built with the
// failpoints tag only).
const (
	// FailPointSend is after the execution grant was spent, before
	// anything is sent to the server.
	FailPointSend = "adapter.send"
	// FailPointResult is after the server's result arrived, before the
	// orchestrator receives it.
	FailPointResult = "adapter.result"
)
