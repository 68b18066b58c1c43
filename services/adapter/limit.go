package adapter

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/v0m3/v0m3/services/internal/reach"
)

// envelopeAllowance is added to a mapping's max_response_bytes to bound one
// inbound message: the JSON-RPC envelope, JSON escaping and metadata around
// the content the mapping limits.
const envelopeAllowance = 16 << 10

// discoveryMessageLimit bounds one inbound message during discovery and
// health checks, where no mapping limit applies.
const discoveryMessageLimit = 4 << 20

// readChunk bounds one read from a stdio server.
const readChunk = 32 << 10

// LimitError is returned by the limited readers once a single inbound
// message exceeds the limit. The read stops there: the rest of the message
// is never buffered.
type LimitError struct {
	// Limit is the per-message byte limit that was exceeded.
	Limit int64
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("inbound message exceeded %d bytes", e.Limit)
}

// meter counts the bytes of one session's inbound messages, enforces the
// per-message limit, and records how far the watched request got. Both
// transports report into it, so the delivery stage is taken from what the
// wire did rather than from what the client library returned.
type meter struct {
	limit    int64
	total    atomic.Int64
	exceeded atomic.Bool

	// refused is the reachability refusal of a dial or redirect, if any.
	refused atomic.Pointer[reach.Error]

	// tap, when set (discovery), sees every complete inbound message.
	tap atomic.Pointer[wireTap]

	mu       sync.Mutex
	watch    []byte // marks the watched request in outbound bytes, e.g. `"method":"tools/call"`
	sent     bool
	acked    bool
	sendTime time.Time
}

func newMeter(limit int64) *meter { return &meter{limit: limit} }

// watchRequest starts watching outbound messages for the request of method.
func (m *meter) watchRequest(method string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.watch = []byte(`"method":"` + method + `"`)
}

// wrote records an outbound message fully written to the transport.
func (m *meter) wrote(msg []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.watch != nil && !m.sent && bytes.Contains(msg, m.watch) {
		m.sent, m.sendTime = true, time.Now()
	}
}

// acknowledged records that the server acknowledged the watched request
// (HTTP response headers).
func (m *meter) acknowledged() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sent {
		m.acked = true
	}
}

// isWatching reports whether msg is the watched request.
func (m *meter) isWatching(msg []byte) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.watch != nil && !m.sent && bytes.Contains(msg, m.watch)
}

// state returns the watched request's progress.
func (m *meter) state() (sent, acked bool, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sent, m.acked, m.sendTime
}

// lineLimitReader counts the bytes of each newline-delimited inbound message
// (stdio) and fails once one exceeds the meter's limit.
type lineLimitReader struct {
	r     io.ReadCloser
	m     *meter
	cur   int64
	err   error
	frame *lineFramer // set once the meter has a tap
}

func (l *lineLimitReader) Read(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	// Small reads keep the overshoot past the limit small.
	if len(p) > readChunk {
		p = p[:readChunk]
	}
	n, err := l.r.Read(p)
	l.m.total.Add(int64(n))
	for _, b := range p[:n] {
		if b == '\n' {
			l.cur = 0
			continue
		}
		l.cur++
		if l.cur > l.m.limit {
			l.m.exceeded.Store(true)
			l.err = &LimitError{Limit: l.m.limit}
			return 0, l.err
		}
	}
	if tap := l.m.tap.Load(); tap != nil {
		if l.frame == nil || l.frame.tap != tap {
			l.frame = &lineFramer{tap: tap}
		}
		l.frame.feed(p[:n])
		if err != nil {
			l.frame.end()
		}
	}
	return n, err
}

func (l *lineLimitReader) Close() error { return l.r.Close() }

// limitedBody counts the bytes of one HTTP response body and fails once it
// exceeds the meter's limit, closing the body so the connection is dropped
// instead of drained.
type limitedBody struct {
	rc    io.ReadCloser
	m     *meter
	n     int64
	err   error
	frame framer // the meter's tap's, if it had one when the response came
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if room := b.m.limit - b.n + 1; int64(len(p)) > room {
		p = p[:room]
	}
	n, err := b.rc.Read(p)
	b.n += int64(n)
	b.m.total.Add(int64(n))
	if b.n > b.m.limit {
		b.m.exceeded.Store(true)
		b.err = &LimitError{Limit: b.m.limit}
		_ = b.rc.Close()
		return 0, b.err
	}
	if b.frame != nil {
		b.frame.feed(p[:n])
		if err != nil {
			b.frame.end()
			b.frame = nil
		}
	}
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }

// refuse records a reachability refusal met inside the transport, where
// the client library may not pass the error on intact.
func (m *meter) refuse(re *reach.Error) { m.refused.CompareAndSwap(nil, re) }

// refusal returns the reachability refusal err carries or the meter
// recorded, if any.
func refusal(err error, m *meter) *reach.Error {
	if re, ok := reach.AsError(err); ok {
		return re
	}
	if m != nil {
		return m.refused.Load()
	}
	return nil
}

// isLimitError reports whether err (or the meter) says a limit was hit.
func isLimitError(err error, m *meter) bool {
	var le *LimitError
	return errors.As(err, &le) || (m != nil && m.exceeded.Load())
}
