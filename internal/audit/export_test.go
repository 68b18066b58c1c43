package audit

import "time"

// SetRetryWait sets the first wait before queued records are appended
// again; call it before the first Record.
func (r *Recorder) SetRetryWait(d time.Duration) { r.q.SetFirstRetry(d) }
