package groupsend

// Waiting is how many callers wait for a send, for tests that pile
// callers up in a known order.
func (s *Sender[T]) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}
