package policy

// Fail points where the fault-injection tests crash or freeze a real
// policy process (internal/failpoint: a binary built with the
// failpoints tag only).
const (
	// FailPointChargeBefore is before a budget charge is stored.
	FailPointChargeBefore = "policy.charge.before"
	// FailPointChargeAfter is after a budget charge is stored, before the
	// caller learns it.
	FailPointChargeAfter = "policy.charge.after"
)
