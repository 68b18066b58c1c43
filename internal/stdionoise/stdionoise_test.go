package stdionoise_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/v0m3/v0m3/internal/stdionoise"
)

// logged is one record a Filter logged.
type logged struct {
	Msg   string `json:"msg"`
	Line  string `json:"line"`
	Bytes int64  `json:"bytes"`
}

// TestFilter: JSON lines (and empty ones) reach the reader byte for byte,
// however long; other lines are dropped, every byte of them counted, and
// the first MaxLogged logged (scrubbed, cut to MaxLogText bytes on a rune
// boundary, with their size), then one notice.
func TestFilter(t *testing.T) {
	t.Parallel()
	long := `{"jsonrpc":"2.0","result":"` + strings.Repeat("x", 200<<10) + `"}` + "\n"
	longNoise := "log: " + strings.Repeat("y", 100<<10) + "\n"
	const secret = "s3cr3t-t0ken"
	notice := "local server keeps printing non-JSON lines on stdout; dropping them without logging"
	dropped := func(line string, n int) logged {
		return logged{Msg: "local server printed a non-JSON line on stdout; dropped", Line: line, Bytes: int64(n)}
	}
	for _, tc := range []struct {
		name  string
		in    string
		scrub func(string) string
		want  string   // what the reader gets
		count int      // dropped bytes counted
		logs  []logged // what is logged
	}{
		{name: "JSON only", in: "{\"a\":1}\n[{\"b\":2}]\n", want: "{\"a\":1}\n[{\"b\":2}]\n"},
		{name: "white space before JSON and empty lines pass", in: "  \t{\"a\":1}\n\n\r\n", want: "  \t{\"a\":1}\n\n\r\n"},
		{name: "banner before JSON", in: "Starting server...\n{\"a\":1}\n", want: "{\"a\":1}\n", count: 19,
			logs: []logged{dropped("Starting server...", 19)}},
		{name: "noise between messages", in: "{\"a\":1}\nDEBUG tick\n{\"b\":2}\n", want: "{\"a\":1}\n{\"b\":2}\n", count: 11,
			logs: []logged{dropped("DEBUG tick", 11)}},
		{name: "a JSON line longer than the buffer", in: "banner\n" + long, want: long, count: 7,
			logs: []logged{dropped("banner", 7)}},
		{name: "a noise line longer than the buffer is counted whole and logged cut", in: longNoise + "{}\n", want: "{}\n", count: len(longNoise),
			logs: []logged{dropped(longNoise[:stdionoise.MaxLogText], len(longNoise))}},
		{name: "cut on a rune boundary", in: strings.Repeat("a", stdionoise.MaxLogText-1) + "é tail\n{}\n", want: "{}\n", count: stdionoise.MaxLogText + 7,
			logs: []logged{dropped(strings.Repeat("a", stdionoise.MaxLogText-1), stdionoise.MaxLogText+7)}},
		{name: "scrubbed before the cut: a secret that starts within what is logged is found whole",
			in:    strings.Repeat("a", stdionoise.MaxLogText-4) + " " + secret + "\n{}\n",
			scrub: func(s string) string { return strings.ReplaceAll(s, secret, "[redacted]") },
			want:  "{}\n", count: stdionoise.MaxLogText - 4 + 1 + len(secret) + 1,
			logs: []logged{dropped(strings.Repeat("a", stdionoise.MaxLogText-4)+" [re", stdionoise.MaxLogText-4+1+len(secret)+1)}},
		{name: "logging is bounded", in: strings.Repeat("noise\n", stdionoise.MaxLogged+3) + "{}\n", want: "{}\n", count: 6 * (stdionoise.MaxLogged + 3),
			logs: append(repeat(dropped("noise", 6), stdionoise.MaxLogged), logged{Msg: notice})},
		{name: "a last line without newline", in: "{}\n{\"a\":1}", want: "{}\n{\"a\":1}"},
		{name: "unfinished noise at the end is counted, not logged", in: "{}\npartial", want: "{}\n", count: 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			count := 0
			// One byte at a time from the server, so every line arrives in
			// pieces.
			f := stdionoise.New(io.NopCloser(iotest.OneByteReader(strings.NewReader(tc.in))), stdionoise.Options{
				Log:   slog.New(slog.NewJSONHandler(&logs, nil)),
				Scrub: tc.scrub,
				Count: func(n int) { count += n },
			})
			got, err := io.ReadAll(f)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if string(got) != tc.want {
				t.Errorf("read %q; want %q", trim(string(got)), trim(tc.want))
			}
			if count != tc.count {
				t.Errorf("counted %d dropped bytes; want %d", count, tc.count)
			}
			var recs []logged
			for l := range strings.Lines(logs.String()) {
				var rec logged
				if err := json.Unmarshal([]byte(l), &rec); err != nil {
					t.Fatalf("log line %q: %v", l, err)
				}
				recs = append(recs, rec)
			}
			if len(recs) != len(tc.logs) {
				t.Fatalf("logged %d records; want %d: %v", len(recs), len(tc.logs), recs)
			}
			for i, want := range tc.logs {
				if recs[i] != want {
					t.Errorf("record %d = %+v; want %+v", i, recs[i], want)
				}
			}
		})
	}
}

// TestFilterReadsInPieces: a reader asking for a few bytes at a time gets
// the same stream.
func TestFilterReadsInPieces(t *testing.T) {
	t.Parallel()
	in := "banner\n{\"jsonrpc\":\"2.0\",\"id\":1}\nnoise\n[{\"jsonrpc\":\"2.0\"}]\n"
	f := stdionoise.New(io.NopCloser(strings.NewReader(in)), stdionoise.Options{})
	if err := iotest.TestReader(f, []byte("{\"jsonrpc\":\"2.0\",\"id\":1}\n[{\"jsonrpc\":\"2.0\"}]\n")); err != nil {
		t.Error(err)
	}
}

// TestFilterClose: closing the Filter closes what it reads.
func TestFilterClose(t *testing.T) {
	t.Parallel()
	r, w := io.Pipe()
	f := stdionoise.New(r, stdionoise.Options{})
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("{}\n")); err == nil {
		t.Error("write to a closed filter's source succeeded; want io.ErrClosedPipe")
	}
}

func repeat(l logged, n int) []logged {
	out := make([]logged, n)
	for i := range out {
		out[i] = l
	}
	return out
}

// trim shortens s for a failure message.
func trim(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
