package adapter

import (
	"context"
	"errors"
	"time"
)

// listChanged is the hook of a pooled session: the server said one of its
// lists (tools, resources, prompts) changed. The session is described
// again at once, on the same session (a new process could describe
// itself differently), and the snapshot recorded to the registry, whose
// drift check sends every mapping the change affects to review before
// the next call is authorized. Notifications that arrive while a
// rediscovery runs lead to one more. It must not block: the client
// library calls it on its reading goroutine.
func (e *pooled) listChanged() {
	p := e.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if e.retired || e.closing || p.closed {
		// A draining session's configuration is no longer current; the
		// session that replaced it describes the server for its own.
		return
	}
	if e.discovering {
		e.rediscover = true
		return
	}
	e.discovering = true
	e.inflight++ // the session stays open while it is described
	p.wg.Add(1)
	go e.rediscoverLoop()
}

// maxRediscoveryRounds bounds how often a session is described again in a
// row, each round asked for by a change during the one before. A server
// whose lists never settle would otherwise be listed, and its
// connection's health reported to policy, without end: past the bound
// the session takes no new calls and closes; the next call gets a new
// one, which is described afresh.
const maxRediscoveryRounds = 3

func (e *pooled) rediscoverLoop() {
	p := e.p
	defer p.wg.Done()
	<-e.ready
	for round := 1; ; round++ {
		if e.err == nil {
			e.describeAndRecord()
		}
		p.mu.Lock()
		if !e.rediscover || e.retired || p.closed {
			e.discovering, e.rediscover = false, false
			p.mu.Unlock()
			break
		}
		if round >= maxRediscoveryRounds {
			p.s.log.Warn("the server's lists keep changing after every rediscovery; its session is replaced at the next call",
				"connection_id", e.conn.GetId(), "rounds", round)
			p.retireLocked(e)
			e.discovering, e.rediscover = false, false
			p.mu.Unlock()
			break
		}
		e.rediscover = false
		p.mu.Unlock()
	}
	e.done(false)
}

// describeAndRecord lists the session's server and records the snapshot.
func (e *pooled) describeAndRecord() {
	s, ss, conn := e.p.s, e.ss, e.conn
	ctx, cancel := context.WithTimeout(e.p.ctx, discoverTimeout)
	defer cancel()
	retrieved := time.Now()
	// Discovery messages may be larger than calls' responses, and the tap
	// reads the execution properties the client library drops.
	lim := ss.m.register("discovery", "", discoveryMessageLimit)
	ss.m.tap.Store(newWireTap())
	snap, err := describeStable(ctx, ss)
	ss.m.tap.Store(nil)
	ss.m.unregister(lim)
	switch {
	case errors.Is(err, errUnstable):
		s.log.Warn("rediscovery after a list change: the server's lists kept changing; nothing recorded", "connection_id", conn.GetId())
		s.reportHealth(ctx, conn.GetId(), false, "the server's lists kept changing during discovery")
		return
	case err != nil:
		_ = s.discoveryFailed(ctx, conn.GetId(), err, ss.m)
		return
	}
	if s.recording() {
		s.recordDiscovery(conn, snap)
	}
	rec, err := s.recordSnapshot(ctx, conn, snap, retrieved)
	if err != nil {
		s.log.Warn("rediscovery after a list change: record snapshot", "connection_id", conn.GetId(), "error", logText(err))
		return
	}
	s.log.Info("server changed its lists; recorded a new snapshot", "connection_id", conn.GetId(), "snapshot_id", rec.GetId())
}
