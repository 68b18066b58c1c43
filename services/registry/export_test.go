package registry

// HandleFieldNames exposes handleFieldNames to the external tests.
var HandleFieldNames = handleFieldNames

// DriftReason exposes driftReason to the external tests.
var DriftReason = driftReason

// WrapStore has the server use wrap(its store), for tests that watch what
// reaches the store.
func (s *Server) WrapStore(wrap func(Store) Store) *Server {
	s.st = wrap(s.st)
	return s
}
