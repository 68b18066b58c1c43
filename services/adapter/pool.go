package adapter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/v0m3/v0m3/internal/serving"
	"github.com/v0m3/v0m3/internal/telemetry"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"google.golang.org/protobuf/proto"
)

// SessionConfig says how the adapter keeps MCP sessions to servers for
// Execute. The zero value is the default.
type SessionConfig struct {
	// MaxCallsPerConnection bounds the calls one connection (at one
	// config revision) has in flight at once on its session. A call
	// beyond it waits for a slot while its deadline allows, then fails
	// with CONNECTION_BUSY having sent nothing. Zero means
	// DefaultMaxCallsPerConnection.
	MaxCallsPerConnection int
	// IdleTimeout is how long a session (and its local server process)
	// may stay unused before it is closed. Zero means
	// DefaultSessionIdleTimeout.
	IdleTimeout time.Duration
}

// Session defaults.
const (
	// DefaultMaxCallsPerConnection admits as many concurrent calls per
	// connection as a busy task fleet sends, not an unbounded number.
	DefaultMaxCallsPerConnection = 32
	// DefaultSessionIdleTimeout keeps a session across the pauses of a
	// task, not across hours of disuse.
	DefaultSessionIdleTimeout = 5 * time.Minute
)

func (c SessionConfig) withDefaults() SessionConfig {
	if c.MaxCallsPerConnection <= 0 {
		c.MaxCallsPerConnection = DefaultMaxCallsPerConnection
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultSessionIdleTimeout
	}
	return c
}

// idleMessageLimit bounds an inbound message on a pooled session while no
// call that allows more is in flight: what a server sends between calls
// (notifications, pings) is small.
const idleMessageLimit = 64 << 10

// openTimeout bounds opening a pooled session (process start, connect
// retries and initialize), independent of the call that asked for it:
// the session outlives that call.
const openTimeout = 60 * time.Second

// CodeConnectionBusy: every call slot of the connection stayed taken until
// the call's deadline; nothing was sent.
const CodeConnectionBusy = "CONNECTION_BUSY"

// errBusy is returned by acquire when no call slot freed up in time.
var errBusy = errors.New("connection busy")

// pool keeps Execute's MCP sessions: one per connection at its current
// configuration (config revision, transport and credential reference),
// shared by that connection's concurrent calls up to a bound. A session is
// dropped when its transport dies, when a call on it broke or gave up
// mid-call (no half-read stream serves another call), when it stayed
// unused for IdleTimeout, and when its connection's configuration changed:
// then it drains (its calls in flight finish on it, new calls go to a new
// session opened with the new configuration and credential) and closes.
// Closing always happens off the calls' paths.
type pool struct {
	s   *Server
	cfg SessionConfig
	// ctx bounds every session opening; cancelled by shutdown.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	current map[string]*pooled // by poolKey: the session new calls get
	all     map[*pooled]struct{}
	closed  bool
	wg      sync.WaitGroup // openings and closings in progress
}

// pooled is one shared session.
type pooled struct {
	p    *pool
	key  string                 // its poolKey
	conn *registryv1.Connection // the configuration it was opened with
	// subject is the requester the session acts for on a token-exchange
	// connection ("" otherwise): such a session carries that person's
	// token, so it serves no one else.
	subject string
	slots   chan struct{}
	ready   chan struct{} // closed once opening ended; then ss and err are set
	ss      *session      // never nil once ready
	err     error

	// Guarded by p.mu.
	inflight    int
	retired     bool // takes no new calls; closes once inflight is 0
	closing     bool
	closed      chan struct{} // closed once the session is closed
	idleGen     int
	discovering bool
	rediscover  bool
}

func newPool(s *Server, cfg SessionConfig) *pool {
	ctx, cancel := context.WithCancel(context.Background())
	return &pool{s: s, cfg: cfg.withDefaults(), ctx: ctx, cancel: cancel,
		current: map[string]*pooled{}, all: map[*pooled]struct{}{}}
}

// sameConfig reports whether a session opened for a may serve a call
// authorized against b. Sessions follow the serving revision: one opened
// before a rotation's workload rolled out drains once the new one serves.
func sameConfig(a, b *registryv1.Connection) bool {
	return serving.Revision(a) == serving.Revision(b) &&
		a.GetCredentialRef() == b.GetCredentialRef() &&
		proto.Equal(a.GetTransport(), b.GetTransport())
}

// acquire returns conn's session with a call slot taken for the caller,
// opening the session if there is none for conn's configuration. The
// caller must call release. On error the returned session, when not nil,
// is the one whose opening failed (its meter tells why).
func (p *pool) acquire(ctx context.Context, conn *registryv1.Connection) (*pooled, *session, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, nil, errAdapterClosed
		}
		subject := subjectOf(ctx).name
		key := poolKey(conn.GetId(), subject)
		e := p.current[key]
		if e != nil && !sameConfig(e.conn, conn) {
			// A new configuration: the old session drains, and closes
			// now when no call is in flight on it (its server process or
			// connection, and the old credential, go with it).
			p.drainLocked(e)
			e = nil
		}
		if e == nil {
			e = &pooled{p: p, key: key, subject: subject, conn: proto.CloneOf(conn), slots: make(chan struct{}, p.cfg.MaxCallsPerConnection), ready: make(chan struct{}), closed: make(chan struct{})}
			p.current[key] = e
			p.all[e] = struct{}{}
			p.wg.Add(1)
			go e.open()
		}
		p.mu.Unlock()

		select {
		case e.slots <- struct{}{}:
		default:
			// Every slot is taken: wait for one while the deadline allows.
			select {
			case e.slots <- struct{}{}:
			case <-ctx.Done():
				return nil, nil, errBusy
			}
		}
		select {
		case <-e.ready:
		case <-ctx.Done():
			<-e.slots
			return nil, nil, ctx.Err()
		}
		if e.err != nil {
			<-e.slots
			return nil, e.ss, e.err
		}
		p.mu.Lock()
		if e.retired {
			// It died or drained while this call waited: take the next.
			p.mu.Unlock()
			<-e.slots
			continue
		}
		e.inflight++
		p.mu.Unlock()
		return e, e.ss, nil
	}
}

// poolKey names the session new calls of a connection get: one per
// connection, or one per connection and requester where the connection
// exchanges the requester's identity for its token.
func poolKey(connectionID, subject string) string {
	if subject == "" {
		return connectionID
	}
	return connectionID + "\x00" + subject
}

// open opens the session, watches it for death and publishes the result.
func (e *pooled) open() {
	p := e.p
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(withSubject(p.ctx, exchangeSubject{name: e.subject}), openTimeout)
	defer cancel()
	ss, err := p.s.openSession(ctx, e.conn, idleMessageLimit, e.listChanged)
	if err == nil {
		ss.primeToolHeaders(ctx)
	}
	if ss == nil {
		ss = &session{m: newMeter(idleMessageLimit), creds: &credentials{}, srv: p.s}
	}
	e.ss, e.err = ss, err
	if err == nil {
		telemetry.MCPSessions.WithLabelValues(transportName(e.conn)).Inc()
	}
	p.mu.Lock()
	if err != nil {
		p.retireLocked(e)
		delete(p.all, e)
		e.closing = true
		close(e.closed)
		p.mu.Unlock()
		close(e.ready)
		return
	}
	if p.closed || e.retired {
		// Shut down, dropped or replaced by a new configuration while it
		// opened: no call has it yet.
		p.retireLocked(e)
		p.closeLocked(e)
	}
	p.mu.Unlock()
	close(e.ready)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		// The transport died (server exited, stream broke, limit cut):
		// no new call gets this session.
		_ = ss.cs.Wait()
		if ss.m.idleFlooded.Load() {
			p.s.log.Warn("the server flooded its session with messages between calls; session closed",
				"connection_id", e.conn.GetId(), "max_notifications", maxNotificationsPerCall, "max_notification_bytes", maxNotificationBytesPerCall)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.retireLocked(e)
		if e.inflight == 0 {
			p.closeLocked(e)
		}
	}()
}

// release returns a call slot. broken says the call left the session in a
// state no other call may inherit (a transport failure, a call abandoned
// mid-response): the session then drains and closes.
func (e *pooled) release(broken bool) {
	e.done(broken)
	<-e.slots
}

// releaseAfterNotice releases a call the caller abandoned (its deadline
// passed, or it was cancelled) on a session that no other call may
// inherit: the session stops taking calls now, and its slot is released,
// and the session closed, once notice is closed (the client library told
// the server the call is cancelled, which it does off the caller's path)
// or after cancelNoticeWait, so closing the session does not swallow the
// notice.
func (e *pooled) releaseAfterNotice(notice <-chan struct{}) {
	p := e.p
	p.mu.Lock()
	p.retireLocked(e)
	if p.closed {
		p.mu.Unlock()
		e.release(true)
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		t := time.NewTimer(cancelNoticeWait)
		defer t.Stop()
		select {
		case <-notice:
		case <-t.C:
		case <-p.ctx.Done():
		}
		e.release(true)
	}()
}

// cancelNoticeWait bounds how long an abandoned call's session stays open
// for its notifications/cancelled to go out.
const cancelNoticeWait = 2 * time.Second

// done is release without the slot: the bookkeeping of one use ending.
func (e *pooled) done(broken bool) {
	p := e.p
	p.mu.Lock()
	e.inflight--
	if broken {
		p.retireLocked(e)
	}
	switch {
	case e.retired && e.inflight == 0:
		p.closeLocked(e)
	case e.inflight == 0:
		p.armIdleLocked(e)
	}
	p.mu.Unlock()
}

// armIdleLocked closes e after IdleTimeout unless a call uses it first.
func (p *pool) armIdleLocked(e *pooled) {
	e.idleGen++
	gen := e.idleGen
	time.AfterFunc(p.cfg.IdleTimeout, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if e.idleGen == gen && e.inflight == 0 && !e.closing {
			p.s.log.Debug("closing an idle session", "connection_id", e.conn.GetId())
			p.retireLocked(e)
			p.closeLocked(e)
		}
	})
}

// retireLocked stops e taking new calls.
func (p *pool) retireLocked(e *pooled) {
	e.retired = true
	if p.current[e.key] == e {
		delete(p.current, e.key)
	}
}

// closeLocked closes e in the background, once.
func (p *pool) closeLocked(e *pooled) {
	if e.closing {
		return
	}
	e.closing = true
	e.idleGen++
	delete(p.all, e)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		e.ss.close()
		telemetry.MCPSessions.WithLabelValues(transportName(e.conn)).Dec()
		close(e.closed)
	}()
}

// closeIdle closes every session without a call in flight now, as the
// idle timeout would, and waits until they are closed.
func (p *pool) closeIdle() {
	var wait []chan struct{}
	p.mu.Lock()
	for e := range p.all {
		select {
		case <-e.ready:
		default:
			continue
		}
		if e.inflight == 0 {
			p.retireLocked(e)
			p.closeLocked(e)
			wait = append(wait, e.closed)
		}
	}
	p.mu.Unlock()
	for _, c := range wait {
		<-c
	}
}

// drop drains the session of a connection that may no longer be used
// (retired, or not approved at its configuration): no call gets it again,
// and it closes once its calls in flight end, instead of at the idle
// timeout.
func (p *pool) drop(connectionID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.current {
		if e.conn.GetId() == connectionID {
			p.drainLocked(e)
		}
	}
}

// drainLocked stops e taking new calls and closes it once its calls in
// flight end: now, when there are none.
func (p *pool) drainLocked(e *pooled) {
	p.retireLocked(e)
	select {
	case <-e.ready:
		if e.inflight == 0 {
			p.closeLocked(e)
		}
	default:
		// Still opening: open closes it.
	}
}

// shutdown closes every session, including those with calls in flight
// (which end with the outcome their transport's closing implies), and
// waits until every opening and closing has ended.
func (p *pool) shutdown() {
	p.mu.Lock()
	p.closed = true
	p.cancel()
	for e := range p.all {
		select {
		case <-e.ready:
			p.retireLocked(e)
			p.closeLocked(e)
		default:
			// Still opening: open sees closed and closes it.
			p.retireLocked(e)
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// stats is a view of the pool for tests and logs.
type poolStats struct {
	Sessions int // open or opening, including draining ones
	InFlight int
}

func (p *pool) stats() poolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	var st poolStats
	for e := range p.all {
		st.Sessions++
		st.InFlight += e.inflight
	}
	return st
}

// busyDetail is the adapter's account of a call that found no slot.
func busyDetail(conn *registryv1.Connection, n int) string {
	return fmt.Sprintf("connection %s already had %d calls in flight (the adapter's per-connection bound) until the call's deadline; nothing was sent. Retry later or raise the bound", conn.GetId(), n)
}

// transportName is a connection's transport as a metric label.
func transportName(c *registryv1.Connection) string {
	switch {
	case c.GetTransport().GetStdio() != nil:
		return "stdio"
	case c.GetTransport().GetStreamableHttp() != nil:
		return "streamable_http"
	}
	return "other"
}
