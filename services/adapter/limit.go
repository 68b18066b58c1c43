package adapter

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/v0m3/v0m3/internal/reach"
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

// A server may send messages of its own (notifications such as progress
// or log messages, and requests to the client) while a call is in flight,
// but not without end: past either bound the call is cancelled (the client
// library tells the server with notifications/cancelled) and ends as
// NOTIFICATION_LIMIT_EXCEEDED instead of holding its attempt open until its
// deadline. Such messages name no call (a log message never does), so each
// is charged to every call in flight on the session; a call's own POST
// stream (HTTP) is charged to that call alone.
const (
	maxNotificationsPerCall     = 10000
	maxNotificationBytesPerCall = 4 << 20
)

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
// per-message bound, and records, per call, how far its request got and
// how large its response was. Both transports report into it, so the
// delivery stage is taken from what the wire did rather than from what the
// client library returned.
//
// A session is shared by concurrent calls, each with its own mapping's
// limit. No inbound message may exceed the bound: the largest limit among
// the calls in flight (and limit, the session's own floor); a message over
// the bound is cut while it arrives and breaks the session. Each call's own
// limit is then checked exactly against its own response (found by its
// JSON-RPC id), so a call whose response exceeds its limit is refused
// while a concurrent call with a larger limit is not.
type meter struct {
	limit    int64
	total    atomic.Int64
	exceeded atomic.Bool

	// refused is the reachability refusal of a dial or redirect, if any.
	refused atomic.Pointer[reach.Error]

	// auth is the server's last refusal of the session's authorization
	// (see observeAuth), if no request succeeded since.
	auth atomic.Pointer[authError]

	// tap, when set (discovery), sees every complete inbound message.
	tap atomic.Pointer[wireTap]

	// abortWrite, when set (stdio; set before the session starts), ends
	// a write to the server that is blocked because the server does not
	// read, and keeps the request of the call giving up from being
	// written later: called with that call when it gives up.
	abortWrite func(gaveUp *callMeter)

	// bound is max(limit, every registered call's limit), kept current.
	bound atomic.Int64

	// idleFlooded: the server's own messages while no call was in
	// flight went past the bounds, and the session was ended for it.
	idleFlooded atomic.Bool
	// endSession, once the session is open, ends it (see endOnIdleFlood).
	endSession atomic.Pointer[func()]

	mu    sync.Mutex
	calls map[*callMeter]struct{}
	byID  map[string]*callMeter // bound calls by their request's JSON-RPC id
	// The server's own messages since the last call was sent, charged to
	// no call: the client library queues them without limit, so they
	// are bounded as a call's are.
	idleNotes, idleBytes int64
}

// errIdleFlood ends a session whose server sent more messages of its own
// between calls than a call may receive during one.
var errIdleFlood = fmt.Errorf("the server sent more than %d messages or %d bytes of them while no call was in flight", maxNotificationsPerCall, maxNotificationBytesPerCall)

// floodedIdle records that the server flooded the session between calls
// and ends the session. Ending the stream the messages came on is not
// enough over HTTP: the client library opens the standalone stream again.
func (m *meter) floodedIdle() {
	if m.idleFlooded.Swap(true) {
		return
	}
	if end := m.endSession.Load(); end != nil {
		go (*end)()
	}
}

// endOnIdleFlood sets how the open session ends once its server floods it
// between calls, and ends it now if that happened while it opened.
func (m *meter) endOnIdleFlood(end func()) {
	var once sync.Once
	f := func() { once.Do(end) }
	m.endSession.Store(&f)
	if m.idleFlooded.Load() {
		go f()
	}
}

// callMeter is one call's share of a session's meter.
type callMeter struct {
	m       *meter
	limit   int64  // the largest response message this call accepts
	method  string // tools/call or resources/read
	attempt string // the attempt id its request carries in _meta

	// Guarded by m.mu.
	id       string // its request's JSON-RPC id, once written
	sent     bool
	acked    bool
	sendTime time.Time
	bytes    int64 // bytes of its response
	exceeded bool  // its response exceeded its limit
	// Server messages seen while the call was in flight, their bytes, and
	// whether they went past the bounds; cancel ends the call then.
	notes, noteBytes int64
	// sharedNotes: some of notes were messages no stream tied to this
	// call, charged to every call in flight, so notes may count other
	// calls' messages.
	sharedNotes bool
	flooded     bool
	cancel      func()
	// cancelled is closed once the client library's notifications/cancelled
	// for this call was written to the server.
	cancelled     chan struct{}
	cancelNoticed bool
	// gaveUp: the call gave up; a request of it not yet written is not
	// written at all (see watchWriter).
	gaveUp atomic.Bool
}

func newMeter(limit int64) *meter {
	m := &meter{limit: limit, calls: map[*callMeter]struct{}{}, byID: map[string]*callMeter{}}
	m.bound.Store(limit)
	return m
}

// currentBound is the largest inbound message the session accepts now.
func (m *meter) currentBound() int64 { return max(m.bound.Load(), m.limit) }

// register adds a call about to send a request of method carrying attempt,
// whose response may be up to limit bytes. The bound rises before the
// request can be written.
func (m *meter) register(method, attempt string, limit int64) *callMeter {
	c := &callMeter{m: m, limit: limit, method: method, attempt: attempt, cancelled: make(chan struct{})}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls[c] = struct{}{}
	m.recomputeLocked()
	return c
}

// unregister removes a finished call: its limit no longer widens the bound.
func (m *meter) unregister(c *callMeter) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.calls, c)
	if c.id != "" && m.byID[c.id] == c {
		delete(m.byID, c.id)
	}
	m.recomputeLocked()
}

func (m *meter) recomputeLocked() {
	b := m.limit
	for c := range m.calls {
		b = max(b, c.limit)
	}
	m.bound.Store(b)
}

// outbound is the part of an outbound message the meter reads.
type outbound struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		Meta map[string]any `json:"_meta"`
	} `json:"params"`
}

// bind finds the registered, not yet sent call whose request msg is, and
// records its JSON-RPC id. It returns nil for any other message.
func (m *meter) bind(msg []byte) *callMeter {
	if !bytes.Contains(msg, []byte(`"tools/call"`)) && !bytes.Contains(msg, []byte(`"resources/read"`)) {
		return nil
	}
	var o outbound
	if json.Unmarshal(msg, &o) != nil || len(o.ID) == 0 {
		return nil
	}
	attempt, _ := o.Params.Meta[AttemptMetaKey].(string)
	id := canonicalID(o.ID)
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.byID[id]; c != nil {
		return c
	}
	for c := range m.calls {
		if c.id == "" && !c.sent && c.method == o.Method && c.attempt == attempt {
			c.id = id
			m.byID[id] = c
			// A call is in flight: the server's messages are its now.
			m.idleNotes, m.idleBytes = 0, 0
			return c
		}
	}
	return nil
}

// cancelledNotice is the part of a notifications/cancelled the meter reads.
type cancelledNotice struct {
	Method string `json:"method"`
	Params struct {
		RequestID json.RawMessage `json:"requestId"`
	} `json:"params"`
}

// cancelNotice returns the request id msg cancels, if msg is a
// notifications/cancelled.
func cancelNotice(msg []byte) (json.RawMessage, bool) {
	if !bytes.Contains(msg, []byte(`"notifications/cancelled"`)) {
		return nil, false
	}
	var n cancelledNotice
	if json.Unmarshal(msg, &n) != nil || n.Method != "notifications/cancelled" || len(n.Params.RequestID) == 0 {
		return nil, false
	}
	return n.Params.RequestID, true
}

// wroteCancel records that msg, just written to the server, was the
// client library's notifications/cancelled for a bound call.
func (m *meter) wroteCancel(msg []byte) {
	if id, ok := cancelNotice(msg); ok {
		m.cancelWritten(id)
	}
}

// cancelWritten records that the notifications/cancelled for the call with
// request id was written to the server.
func (m *meter) cancelWritten(id json.RawMessage) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.byID[canonicalID(id)]; c != nil && !c.cancelNoticed {
		c.cancelNoticed = true
		close(c.cancelled)
	}
}

// markSent records the call's request fully written to the transport.
func (c *callMeter) markSent() {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if !c.sent {
		c.sent, c.sendTime = true, time.Now()
	}
}

// acknowledged records that the server acknowledged the call's request
// (HTTP response headers).
func (c *callMeter) acknowledged() {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if c.sent {
		c.acked = true
	}
}

// cancelOnFlood sets the function that ends the call once the server's
// own messages exceed the bounds.
func (c *callMeter) cancelOnFlood(cancel func()) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	c.cancel = cancel
}

// isFlooded reports whether the server's own messages during the call went
// past the bounds.
func (c *callMeter) isFlooded() bool {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.flooded
}

// serverMessage charges a complete message of n bytes the server sent on
// its own (a notification or a request, not a response) to call, or, when
// call is nil, to every call in flight; calls it floods are cancelled.
// With no call in flight it is charged to the session, and serverMessage
// reports whether the session is flooded: the reader (of stdout, or of
// the HTTP standalone stream) then ends it (floodedIdle).
func (m *meter) serverMessage(call *callMeter, n int64) (idleFlood bool) {
	var cancels []func()
	m.mu.Lock()
	charge := func(c *callMeter) {
		c.notes++
		c.noteBytes += n
		if !c.flooded && (c.notes > maxNotificationsPerCall || c.noteBytes > maxNotificationBytesPerCall) {
			c.flooded = true
			if c.cancel != nil {
				cancels = append(cancels, c.cancel)
			}
		}
	}
	if call != nil {
		charge(call)
	} else {
		var charged []*callMeter
		for c := range m.calls {
			if c.id != "" {
				charge(c)
				charged = append(charged, c)
			}
		}
		if len(charged) > 1 {
			for _, c := range charged {
				c.sharedNotes = true
			}
		}
		if len(charged) == 0 {
			m.idleNotes++
			m.idleBytes += n
			idleFlood = m.idleNotes > maxNotificationsPerCall || m.idleBytes > maxNotificationBytesPerCall
		}
	}
	m.mu.Unlock()
	// Cancelled outside the lock: the client library may write (its
	// cancellation notice) through this meter.
	for _, cancel := range cancels {
		cancel()
	}
	return idleFlood
}

// serverMessages returns how many messages of its own the server sent
// while the call was in flight, and whether that count may include other
// calls' messages.
func (c *callMeter) serverMessages() (n int64, shared bool) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.notes, c.sharedNotes
}

// state returns the call's progress: how far its request got, how many
// bytes its response had, and whether that response exceeded the call's
// own limit.
func (c *callMeter) state() (sent, acked bool, at time.Time, n int64, exceeded bool) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.sent, c.acked, c.sendTime, c.bytes, c.exceeded
}

// unattributed records a complete inbound message of n bytes whose
// kind and id the meter could not read with certainty: every call in
// flight whose limit it exceeds is charged with it.
func (m *meter) unattributed(n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for c := range m.calls {
		if c.id != "" && n > c.limit {
			c.bytes += n
			c.exceeded = true
		}
	}
}

// response records n bytes of an inbound message that answers id (its
// whole size when complete), and whether it went over the bound. An
// unknown id over the bound is charged to every call in flight: the
// message was larger than all their limits.
func (m *meter) response(id string, n int64, complete, overBound bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.byID[id]; id != "" && c != nil {
		c.bytes += n
		if overBound || (complete && n > c.limit) {
			c.exceeded = true
		}
		return
	}
	if overBound {
		// Any call whose request went out (or is going out) may be the
		// one answered.
		for c := range m.calls {
			if c.id != "" {
				c.bytes += n
				c.exceeded = true
			}
		}
	}
}

// lineLimitReader counts the bytes of each newline-delimited inbound message
// (stdio), fails once one exceeds the meter's bound, and charges each
// response to the call it answers.
type lineLimitReader struct {
	r     io.ReadCloser
	m     *meter
	cur   int64
	scan  idScanner
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
	// Read after the bytes arrived: every call whose request could have
	// caused them is registered by now.
	bound := l.m.currentBound()
	for _, b := range p[:n] {
		if b == '\n' {
			switch id := l.scan.responseID(); {
			case id != "":
				l.m.response(id, l.cur, true, false)
			case l.scan.escapedKey:
				l.m.unattributed(l.cur)
			case l.scan.hasMethod:
				if l.m.serverMessage(nil, l.cur) {
					l.m.floodedIdle()
					l.err = errIdleFlood
					return 0, l.err
				}
			}
			l.cur = 0
			l.scan.reset()
			continue
		}
		l.cur++
		l.scan.feed(b)
		if l.cur > bound {
			l.m.exceeded.Store(true)
			l.m.response(l.scan.responseID(), l.cur, false, true)
			l.err = &LimitError{Limit: bound}
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

// maxIDBytes bounds a JSON-RPC id the scanner keeps; a longer one is
// nobody's (the adapter's own ids are short numbers).
const maxIDBytes = 64

// idScanner finds, byte by byte and without keeping the message, the
// top-level "id" of one inbound JSON-RPC message and whether it has a
// top-level "method" (a request or notification from the server, whose
// id is in the server's own numbering, not a response).
type idScanner struct {
	depth     int
	inStr     bool
	esc       bool
	expectKey bool
	inKey     bool
	key       [8]byte
	keyLen    int // -1 once the key is longer than any we look for
	valueOf   string
	capturing bool
	id        [maxIDBytes]byte
	idLen     int // -1 once the id is too long
	hasID     bool
	hasMethod bool
	// escapedKey: a top-level key held an escape, which could spell "id"
	// or "method" past this scanner; the message is charged as unknown.
	escapedKey bool
}

func (s *idScanner) reset() { *s = idScanner{} }

// responseID is the message's id if it is a response, else "".
func (s *idScanner) responseID() string {
	if s.capturing {
		s.endValue()
	}
	if !s.hasID || s.hasMethod || s.idLen <= 0 {
		return ""
	}
	return canonicalID(s.id[:s.idLen])
}

// canonicalID is a JSON-RPC id token as the client library reads it: a
// number is an integer (1, 1.0 and 1e0 are one id), a string stays quoted
// (never equal to a number).
func canonicalID(tok []byte) string {
	tok = bytes.TrimSpace(tok)
	if len(tok) == 0 || tok[0] == '"' {
		return string(tok)
	}
	f, err := strconv.ParseFloat(string(tok), 64)
	if err != nil {
		return string(tok)
	}
	return strconv.FormatInt(int64(f), 10)
}

func (s *idScanner) capture(b byte) {
	if s.idLen < 0 {
		return
	}
	if s.idLen == len(s.id) {
		s.idLen = -1
		return
	}
	s.id[s.idLen] = b
	s.idLen++
}

func (s *idScanner) endValue() {
	if s.capturing {
		s.capturing = false
		s.hasID = true
	}
}

func (s *idScanner) feed(b byte) {
	if s.inStr {
		if s.capturing {
			s.capture(b)
		}
		switch {
		case s.esc:
			s.esc = false
		case b == '\\':
			s.esc = true
			if s.inKey {
				s.escapedKey = true
			}
		case b == '"':
			s.inStr = false
			if s.inKey {
				s.inKey = false
				s.valueOf = ""
				if s.keyLen >= 0 {
					s.valueOf = string(s.key[:s.keyLen])
				}
			}
			return
		}
		if s.inKey && !s.esc && b != '\\' {
			if s.keyLen >= 0 && s.keyLen < len(s.key) {
				s.key[s.keyLen] = b
				s.keyLen++
			} else {
				s.keyLen = -1
			}
		}
		return
	}
	switch b {
	case '"':
		s.inStr = true
		if s.depth == 1 && s.expectKey {
			s.expectKey, s.inKey, s.keyLen = false, true, 0
		} else if s.capturing {
			s.capture(b)
		}
	case '{', '[':
		if s.capturing {
			// An object or array is no id.
			s.capturing, s.idLen = false, -1
		}
		s.depth++
		if s.depth == 1 && b == '{' {
			s.expectKey = true
		}
	case '}', ']':
		if s.depth == 1 {
			s.endValue()
		}
		s.depth--
	case ',':
		if s.depth == 1 {
			s.endValue()
			s.expectKey = true
		}
	case ':':
		if s.depth == 1 {
			switch s.valueOf {
			case "id":
				s.capturing, s.idLen = true, 0
			case "method":
				s.hasMethod = true
			}
			s.valueOf = ""
		}
	case ' ', '\t', '\r':
	default:
		if s.capturing {
			s.capture(b)
		}
	}
}

// limitedBody counts the bytes of one HTTP response body and fails once it
// exceeds the meter's bound, closing the body so the connection is dropped
// instead of drained. A body that answers a call (the response stream of
// its POST) is charged to that call, whose own limit is checked exactly
// once the body ends.
type limitedBody struct {
	rc    io.ReadCloser
	m     *meter
	call  *callMeter // the call whose POST this body answers, or nil
	n     int64
	err   error
	frame framer // the meter's tap's, if it had one when the response came
	// perEvent counts each server-sent event on its own (a stream no call
	// owns); lineStart says the last byte ended a line.
	perEvent, lineStart bool
	// events, on an event stream, finds the server's own messages.
	events *eventCounter
}

// eventCounter follows the events of a server-sent event stream and
// charges each that is a server's own message (it has a method) to the
// stream's call, or to every call in flight.
type eventCounter struct {
	lineStart bool
	n         int64
	scan      idScanner
}

// feed reads p; the event fields around the JSON data are no JSON
// structure to the scanner. On a stream no call owns, a response (a
// call's stream resumed with Last-Event-ID after it dropped) is charged
// to the call it answers, found by its id. It reports whether the
// server's own messages flooded the session between calls.
func (e *eventCounter) feed(m *meter, call *callMeter, p []byte) (idleFlood bool) {
	for _, c := range p {
		if e.next(c) {
			switch {
			case e.scan.hasMethod:
				idleFlood = m.serverMessage(call, e.n) || idleFlood
			case call == nil:
				if id := e.scan.responseID(); id != "" {
					m.response(id, e.n, true, false)
				}
			}
			e.n, e.scan = 0, idScanner{}
		}
	}
	return idleFlood
}

// next counts one byte of the stream; it reports whether the byte ended
// an event (the blank line after it), which is not counted.
func (e *eventCounter) next(c byte) (ended bool) {
	switch {
	case c == '\n' && e.lineStart:
		return true
	case c == '\n':
		e.lineStart = true
	case c != '\r':
		e.lineStart = false
	}
	e.n++
	e.scan.feed(c)
	return false
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	bound := b.m.currentBound()
	if room := bound - b.n + 1; int64(len(p)) > room {
		p = p[:max(room, 1)]
	}
	n, err := b.rc.Read(p)
	b.m.total.Add(int64(n))
	if b.perEvent {
		if b.events.feed(b.m, nil, p[:n]) {
			b.m.floodedIdle()
			b.err = errIdleFlood
			_ = b.rc.Close()
			return 0, b.err
		}
		return b.readEvents(p[:n], err)
	}
	if b.events != nil && b.call != nil {
		return b.readCallEvents(p[:n], err)
	}
	b.n += int64(n)
	if b.call != nil {
		b.call.charge(int64(n))
	}
	if b.n > b.m.currentBound() {
		b.m.exceeded.Store(true)
		if b.call != nil {
			b.call.exceed()
		}
		b.err = &LimitError{Limit: bound}
		_ = b.rc.Close()
		return 0, b.err
	}
	if err != nil && b.call != nil && b.n > b.call.limit {
		b.call.exceed()
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

// readCallEvents counts p, just read, from the event stream that answers
// a call: each event is one message, bounded on its own; the server's own
// messages (notifications) count against the notification bounds, the
// rest (the response) against the call's response limit.
func (b *limitedBody) readCallEvents(p []byte, err error) (int, error) {
	bound := b.m.currentBound()
	e := b.events
	for _, c := range p {
		if e.next(c) {
			b.endCallEvent()
			continue
		}
		if e.n > bound {
			b.m.exceeded.Store(true)
			b.call.charge(e.n)
			b.call.exceed()
			b.err = &LimitError{Limit: bound}
			_ = b.rc.Close()
			return 0, b.err
		}
	}
	if err != nil {
		b.endCallEvent()
	}
	if b.frame != nil {
		b.frame.feed(p)
		if err != nil {
			b.frame.end()
			b.frame = nil
		}
	}
	return len(p), err
}

// endCallEvent charges a complete event of a call's stream.
func (b *limitedBody) endCallEvent() {
	e := b.events
	switch {
	case e.n == 0:
	case e.scan.hasMethod:
		b.m.serverMessage(b.call, e.n)
	default:
		b.n += e.n
		b.call.charge(e.n)
		if e.n > b.call.limit {
			b.call.exceed()
		}
	}
	e.n, e.scan = 0, idScanner{}
}

// readEvents counts p, just read, event by event: a blank line ends an
// event.
func (b *limitedBody) readEvents(p []byte, err error) (int, error) {
	bound := b.m.currentBound()
	for _, c := range p {
		switch {
		case c == '\n' && b.lineStart:
			b.n = 0
			continue
		case c == '\n':
			b.lineStart = true
		case c != '\r':
			b.lineStart = false
		}
		b.n++
		if b.n > bound {
			b.m.exceeded.Store(true)
			b.err = &LimitError{Limit: bound}
			_ = b.rc.Close()
			return 0, b.err
		}
	}
	if b.frame != nil {
		b.frame.feed(p)
		if err != nil {
			b.frame.end()
			b.frame = nil
		}
	}
	return len(p), err
}

func (b *limitedBody) Close() error {
	if b.call != nil && b.n > b.call.limit {
		b.call.exceed()
	}
	return b.rc.Close()
}

// charge adds n bytes to the call's response.
func (c *callMeter) charge(n int64) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	c.bytes += n
}

// exceed marks the call's response over its limit.
func (c *callMeter) exceed() {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	c.exceeded = true
}

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
