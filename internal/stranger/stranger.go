// Package stranger bounds what a V0M3 surface tells, and writes down
// about, callers it has not authenticated: the task MCP endpoint, the
// bridge, the metrics endpoint, gRPC health and the guard's refusals. A
// stranger decides the size of its Host header, path and token, and how
// often it asks; none of that may decide the size of an answer or of the
// log. So:
//
//   - Clip cuts any value the caller chose to EchoBytes, marking the cut,
//     before it goes into an answer or a log line;
//   - HTTPServer bounds the request line and headers a server reads
//     (MaxHeaderBytes): past it net/http answers 431 and no handler runs;
//     serve bounds gRPC metadata likewise (MaxGRPCHeaderBytes);
//   - Refusals logs a surface's refusals from a token bucket: a burst,
//     then a few a second, the next line logged saying how many were not.
package stranger

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"golang.org/x/time/rate"
)

// EchoBytes bounds each caller-chosen value an answer or a log line
// repeats: room for any legitimate host name, task id or reason, not for
// a payload.
const EchoBytes = 256

// MaxHeaderBytes bounds the request line and headers an unauthenticated
// HTTP surface reads (http.Server.MaxHeaderBytes; net/http allows 4 KiB
// more before it answers 431). An MCP client's headers, a 256-byte task
// token included, are a few hundred bytes.
const MaxHeaderBytes = 16 << 10

// MaxGRPCHeaderBytes bounds the metadata a gRPC server reads of one call
// (grpc.MaxHeaderListSize): a bearer token with many groups fits, a
// stranger's megabyte does not (gRPC's default is 16 MiB).
const MaxGRPCHeaderBytes = 64 << 10

// Refusals are logged at most RefusalRate a second per surface, in bursts
// of RefusalBurst, unless a Refusals says otherwise.
const (
	RefusalRate  = 5
	RefusalBurst = 20
)

// Clip returns s cut to EchoBytes (see ClipN).
func Clip(s string) string { return ClipN(s, EchoBytes) }

// ClipN returns s when it is at most n bytes long, and otherwise its
// first n bytes at most (never splitting a UTF-8 character) followed by a
// mark saying how many bytes were cut, so a reader knows it is not whole.
func ClipN(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := max(n, 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…[%d bytes cut]", s[:cut], len(s)-cut)
}

// HTTPServer returns a server for h that bounds what a stranger makes it
// read: the request line and headers (MaxHeaderBytes) and how long their
// arrival may take.
func HTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: MaxHeaderBytes}
}

// Refusals logs one surface's refusals at a bounded rate, with every
// string value clipped (Clip). Its zero value logs nothing; set Log.
type Refusals struct {
	// Log receives the lines; nil logs nothing.
	Log *slog.Logger
	// Rate and Burst bound the lines; zero means RefusalRate and
	// RefusalBurst.
	Rate  rate.Limit
	Burst int
	// Now returns the time; nil means time.Now. Set it before the first
	// refusal.
	Now func() time.Time

	once     sync.Once
	lim      *rate.Limiter
	unlogged atomic.Int64
}

// Admit says whether a refusal may be logged now, and how many went
// unlogged since the last one that was. A surface that builds its own
// line uses it; others call Warn.
func (r *Refusals) Admit() (unlogged int64, ok bool) {
	r.once.Do(func() {
		lim, burst := r.Rate, r.Burst
		if lim == 0 {
			lim = RefusalRate
		}
		if burst == 0 {
			burst = RefusalBurst
		}
		r.lim = rate.NewLimiter(lim, burst)
	})
	now := time.Now()
	if r.Now != nil {
		now = r.Now()
	}
	if !r.lim.AllowN(now, 1) {
		r.unlogged.Add(1)
		return 0, false
	}
	return r.unlogged.Swap(0), true
}

// Warn logs a refusal at warning level, unless too many came lately:
// attrs are slog key-value pairs (or slog.Attr), every string, error and
// Stringer value clipped. The line says how many refusals went unlogged
// before it (unlogged_before), when any did.
func (r *Refusals) Warn(ctx context.Context, msg string, attrs ...any) {
	r.log(ctx, slog.LevelWarn, msg, attrs)
}

// Info is Warn at info level.
func (r *Refusals) Info(ctx context.Context, msg string, attrs ...any) {
	r.log(ctx, slog.LevelInfo, msg, attrs)
}

func (r *Refusals) log(ctx context.Context, level slog.Level, msg string, attrs []any) {
	if r == nil || r.Log == nil {
		return
	}
	unlogged, ok := r.Admit()
	if !ok {
		return
	}
	out := ClipAttrs(attrs...)
	if unlogged > 0 {
		out = append(out, slog.Int64("unlogged_before", unlogged))
	}
	r.Log.Log(ctx, level, Clip(msg), out...)
}

// ClipAttrs returns slog key-value pairs (or slog.Attr) as attributes
// with every string, error and fmt.Stringer value clipped, and every key.
func ClipAttrs(attrs ...any) []any {
	out := make([]any, 0, len(attrs))
	for len(attrs) > 0 {
		switch a := attrs[0].(type) {
		case slog.Attr:
			out = append(out, clipAttr(a))
			attrs = attrs[1:]
		case string:
			if len(attrs) == 1 {
				out = append(out, slog.String("!BADKEY", Clip(a)))
				attrs = nil
				continue
			}
			out = append(out, clipAttr(slog.Any(a, attrs[1])))
			attrs = attrs[2:]
		default:
			out = append(out, clipAttr(slog.Any("!BADKEY", a)))
			attrs = attrs[1:]
		}
	}
	return out
}

func clipAttr(a slog.Attr) slog.Attr {
	a.Key = Clip(a.Key)
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, Clip(v.String()))
	case slog.KindGroup:
		g := v.Group()
		out := make([]any, len(g))
		for i, x := range g {
			out[i] = clipAttr(x)
		}
		return slog.Group(a.Key, out...)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok && err != nil {
			return slog.String(a.Key, Clip(err.Error()))
		}
		if s, ok := v.Any().(fmt.Stringer); ok {
			return slog.String(a.Key, Clip(s.String()))
		}
		if b, ok := v.Any().([]byte); ok {
			return slog.String(a.Key, Clip(string(b)))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
