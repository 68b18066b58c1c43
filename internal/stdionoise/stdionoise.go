// Package stdionoise drops the noise a local MCP server prints on its
// stdout. Some community servers print a banner or a log line there before
// (or between) JSON-RPC messages, which other MCP clients tolerate. The
// adapter (which runs local servers over stdio) and the operator's stdio
// bridge both read such a stdout, so the rule for what passes, and how
// much of what is dropped gets logged, lives here once.
package stdionoise

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"strings"
)

const (
	// MaxLogged is how many dropped lines a Filter logs; after them it
	// logs one notice and drops the rest silently.
	MaxLogged = 5
	// MaxLogText is how much of a dropped line is logged, in bytes.
	MaxLogText = 200
	// maxKept is how much of a dropped line is kept to be scrubbed before
	// it is cut to MaxLogText: a secret that starts within what is logged
	// is found whole.
	maxKept = 4 << 10
	// bufSize is the read buffer; a longer line is handled in pieces.
	bufSize = 64 << 10
)

// Options say what a Filter does with the lines it drops.
type Options struct {
	// Log receives a warning for each of the first MaxLogged dropped
	// lines (the line, scrubbed and cut short, and its size), then one
	// notice. Callers add their own attributes (session, connection) with
	// Log.With.
	Log *slog.Logger
	// Scrub, if set, rewrites a dropped line before it is logged, e.g. to
	// remove a credential: the line is untrusted text. It sees up to 4 KiB
	// of the line.
	Scrub func(string) string
	// Count, if set, is told the size of every piece of a dropped line as
	// it is read, so that a byte meter counts the noise too.
	Count func(n int)
}

// Filter passes the JSON lines of a server's stdout and drops the others.
// It decides by a line's first byte that is not white space ('{' or '['
// is JSON-RPC; an empty line passes), so memory stays bounded however long
// a line is.
type Filter struct {
	r        *bufio.Reader
	c        io.Closer
	o        Options
	start    bool // at the start of a line
	pass     bool // the current line is passed on
	pending  []byte
	noise    []byte // the start of the current dropped line
	noiseLen int64
	dropped  int
}

// New returns a Filter reading rc; closing the Filter closes rc.
func New(rc io.ReadCloser, o Options) *Filter {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Filter{r: bufio.NewReaderSize(rc, bufSize), c: rc, o: o, start: true}
}

// Read reads the passed lines.
func (f *Filter) Read(p []byte) (int, error) {
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
				f.drop(chunk)
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

// drop counts a piece of a dropped line and keeps its start.
func (f *Filter) drop(chunk []byte) {
	if f.o.Count != nil {
		f.o.Count(len(chunk))
	}
	f.noiseLen += int64(len(chunk))
	if room := maxKept - len(f.noise); room > 0 {
		f.noise = append(f.noise, chunk[:min(room, len(chunk))]...)
	}
}

// logDropped logs the line just dropped, while the bound on logged lines
// allows.
func (f *Filter) logDropped() {
	switch {
	case f.dropped <= MaxLogged:
		line := strings.TrimSpace(string(f.noise))
		if f.o.Scrub != nil {
			line = f.o.Scrub(line)
		}
		if len(line) > MaxLogText {
			line = line[:MaxLogText]
		}
		// Invalid UTF-8, such as a rune the cut split, is dropped.
		f.o.Log.Warn("local server printed a non-JSON line on stdout; dropped", "line", strings.ToValidUTF8(line, ""), "bytes", f.noiseLen)
	case f.dropped == MaxLogged+1:
		f.o.Log.Warn("local server keeps printing non-JSON lines on stdout; dropping them without logging")
	}
}

// Close closes the reader the Filter reads.
func (f *Filter) Close() error { return f.c.Close() }
