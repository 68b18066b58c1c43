package registry

// HandleFieldNames exposes handleFieldNames to the external tests.
var HandleFieldNames = handleFieldNames
