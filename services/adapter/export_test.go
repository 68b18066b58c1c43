package adapter

// ProcessStarts is the number of local server processes the adapter
// started, for tests outside the package.
func (s *Server) ProcessStarts() int64 { return s.procStarts.Load() }

// ProcessesLive is the number of local server processes not yet reaped.
func (s *Server) ProcessesLive() int64 { return s.procLive.Load() }
