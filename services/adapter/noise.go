package adapter

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"strings"
)

// Noise on a local server's stdout: some community servers print a banner
// or a log line to stdout before (or between) JSON-RPC messages, which
// other MCP clients tolerate. Such lines are dropped and logged: the
// first few of each session only, scrubbed of the connection's credential
// and cut short, since they are untrusted text.
const (
	maxNoiseLogged = 5
	// maxNoiseLogText is how much of a dropped line is logged.
	maxNoiseLogText = 200
	// maxNoiseKept is how much of a dropped line is kept to be scrubbed
	// before it is cut to maxNoiseLogText: a credential that starts
	// within what is logged is found whole.
	maxNoiseKept = 4 << 10
)

// noiseFilter passes the JSON lines of a local server's stdout and drops
// the others. It decides by a line's first byte ('{' or '[' is JSON-RPC),
// so memory stays bounded however long a line is; the bytes it drops
// still count towards the meter's total.
type noiseFilter struct {
	r            *bufio.Reader
	c            io.Closer
	m            *meter
	creds        *credentials
	log          *slog.Logger
	connectionID string
	start        bool // at the start of a line
	pass         bool // the current line is passed on
	pending      []byte
	noise        []byte // the start of the current dropped line
	noiseLen     int64
	dropped      int
}

func newNoiseFilter(rc io.ReadCloser, m *meter, creds *credentials, log *slog.Logger, connectionID string) *noiseFilter {
	return &noiseFilter{r: bufio.NewReaderSize(rc, 64<<10), c: rc, m: m, creds: creds, log: log, connectionID: connectionID, start: true}
}

func (f *noiseFilter) Read(p []byte) (int, error) {
	for len(f.pending) == 0 {
		chunk, err := f.r.ReadSlice('\n')
		if len(chunk) > 0 {
			if f.start {
				trimmed := bytes.TrimLeft(chunk, " \t\r\n")
				f.pass = len(trimmed) == 0 || trimmed[0] == '{' || trimmed[0] == '['
				f.noise, f.noiseLen = f.noise[:0], 0
			}
			if f.pass {
				f.pending = append(f.pending[:0], chunk...)
			} else {
				f.m.total.Add(int64(len(chunk)))
				f.noiseLen += int64(len(chunk))
				if room := maxNoiseKept - len(f.noise); room > 0 {
					f.noise = append(f.noise, chunk[:min(room, len(chunk))]...)
				}
			}
			f.start = err == nil
			if f.start && !f.pass {
				f.dropped++
				f.logDropped()
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			if len(f.pending) > 0 {
				break
			}
			return 0, err
		}
	}
	n := copy(p, f.pending)
	f.pending = f.pending[n:]
	return n, nil
}

// logDropped logs the line just dropped, while the session's bound on
// logged lines allows.
func (f *noiseFilter) logDropped() {
	switch {
	case f.dropped <= maxNoiseLogged:
		line := truncate(f.creds.text(strings.TrimSpace(string(f.noise))), maxNoiseLogText)
		f.log.Warn("local server printed a non-JSON line on stdout; dropped", "connection_id", f.connectionID, "line", line, "bytes", f.noiseLen)
	case f.dropped == maxNoiseLogged+1:
		f.log.Warn("local server keeps printing non-JSON lines on stdout; dropping them without logging", "connection_id", f.connectionID)
	}
}

func (f *noiseFilter) Close() error { return f.c.Close() }
