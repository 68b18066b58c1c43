package registry

// HandleFieldNames exposes handleFieldNames to the external tests.
var HandleFieldNames = handleFieldNames

// DriftReason exposes driftReason to the external tests.
var DriftReason = driftReason
