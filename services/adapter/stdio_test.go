package adapter

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/v0m3/v0m3/internal/testkit"
)

var (
	slowRequest = []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow"}}` + "\n")
	cancelSlow  = []byte(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"context canceled"}}` + "\n")
	abortRounds = 5
)

// TestAbortBlockedSparesTheCancelNotice: when a call gives up, the
// adapter ends a message write blocked on a server that does not read
// (the stream is then unusable), but not the notifications/cancelled the
// client library is writing for that call, which is how the server learns
// that the call was given up. Both writes here wait on a full pipe when
// the abort comes, as a write just started may under load.
func TestAbortBlockedSparesTheCancelNotice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		msg    []byte
		kind   writeKind
		notice bool
	}{
		{name: "a blocked request is ended", msg: slowRequest, kind: writeMessage},
		{name: "a blocked cancellation notice goes out", msg: cancelSlow, kind: writeNotice, notice: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Whether the abort or the server's next read reaches a
			// blocked write first is up to the scheduler: a few rounds
			// make a notice ended by the abort show.
			for range abortRounds {
				abortDuringWrite(t, tc.msg, tc.kind, tc.notice)
			}
		})
	}
}

// abortDuringWrite writes msg, of the given kind, to a server that has
// stopped reading, aborts blocked writes, and checks the outcome.
func abortDuringWrite(t *testing.T, msg []byte, kind writeKind, notice bool) {
	t.Helper()
	r, w, call := pipeWriter(t)
	if notice {
		// The call's request went out before the server stopped reading.
		w.m.bind(slowRequest)
	}
	fillPipe(t, w.w)

	wrote := make(chan error, 1)
	go func() {
		_, err := w.Write(msg)
		wrote <- err
	}()
	testkit.Eventually(t, "the write is in progress", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.writing == kind
	})
	w.abortBlocked(call)
	if !notice {
		// The server never reads again: the write ends, and so does
		// every later one.
		if err := <-wrote; err == nil {
			t.Fatal("the blocked request was written whole after the abort")
		}
		if _, err := w.Write(cancelSlow); !errors.Is(err, errStreamCut) {
			t.Fatalf("a write after a cut one: got %v, want errStreamCut", err)
		}
		return
	}

	// The server reads again.
	read := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(r)
		read <- b
	}()
	err := <-wrote
	_ = w.w.Close()
	got := <-read
	if err != nil {
		t.Fatalf("the cancellation notice was ended by the abort: %v", err)
	}
	if !bytes.HasSuffix(got, msg) {
		t.Fatalf("the server did not read the whole notice; last bytes %q", got[max(0, len(got)-len(msg)):])
	}
	select {
	case <-call.cancelled:
	default:
		t.Fatal("the meter was not told the notice went out")
	}
}

// pipeWriter returns a watchWriter over a new pipe, the pipe's read end
// (the server's stdin), and a call registered with its meter. Both ends
// are closed when the test ends.
func pipeWriter(t *testing.T) (*os.File, *watchWriter, *callMeter) {
	t.Helper()
	r, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(r, pw) })
	m := newMeter(1 << 20)
	return r, &watchWriter{w: pw, m: m}, m.register("tools/call", "", 1<<20)
}

// fillPipe writes to w until the pipe is full, without blocking and
// without a deadline a loaded machine could miss.
func fillPipe(t *testing.T, w *os.File) {
	t.Helper()
	rc, err := w.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{' '}, 4096)
	var werr error
	if err := rc.Write(func(fd uintptr) bool {
		for werr == nil {
			_, werr = syscall.Write(int(fd), chunk)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(werr, syscall.EAGAIN) {
		t.Fatalf("filling the pipe: %v", werr)
	}
}

// A call that gave up while its request waited (behind another write, say)
// never has it written: the server does not get a request the adapter
// already reports as not sent, and the stream stays whole for the other
// calls on the session.
func TestGivenUpRequestIsNotWritten(t *testing.T) {
	t.Parallel()
	r, w, gaveUp := pipeWriter(t)
	w.abortBlocked(gaveUp)
	if _, err := w.Write(slowRequest); !errors.Is(err, errCallGaveUp) {
		t.Fatalf("the given-up call's request: got %v, want errCallGaveUp", err)
	}
	other := []byte(`{"jsonrpc":"2.0","id":8,"method":"ping"}` + "\n")
	if _, err := w.Write(other); err != nil {
		t.Fatalf("another call's message after the refusal: %v", err)
	}
	_ = w.w.Close()
	got, _ := io.ReadAll(r)
	if !bytes.Equal(got, other) {
		t.Fatalf("the server read %q, want only the other call's message", got)
	}
}

// TestRequestCutBeforeItsNewlineIsSent: a request write the adapter ends
// (the call gave up on a server that stopped reading) after every byte
// but the newline counts as sent, since the server holds the whole JSON
// request and may act on it: the call is not retried on a new session as
// one that never went out. A shorter cut leaves truncated JSON, and the
// request counts as not sent. The cut is made in a real pipe of two pages,
// one filled: the write stops after one page, so the request is sized to
// be cut where the case wants.
func TestRequestCutBeforeItsNewlineIsSent(t *testing.T) {
	t.Parallel()
	const page = 4096
	for _, tc := range []struct {
		name     string
		unsent   int // bytes of the request past the free page
		wantSent bool
	}{
		{"all but the newline", 1, true},
		{"the JSON cut short", 100, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			head := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow","arguments":{"pad":"`
			tail := `"}}}` + "\n"
			req := []byte(head + strings.Repeat("x", page+tc.unsent-len(head)-len(tail)) + tail)
			r, w, call := pipeWriter(t)
			// Not Fd(): it would make the pipe blocking, and a write
			// deadline could no longer end the write.
			rc, err := w.w.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var size int
			if cerr := rc.Control(func(fd uintptr) {
				size, err = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 2*page)
			}); cerr != nil || err != nil || size != 2*page {
				t.Skipf("cannot size the pipe to two pages: %d, %v, %v", size, cerr, err)
			}
			prefill := bytes.Repeat([]byte{' '}, page)
			if _, err := w.w.Write(prefill); err != nil {
				t.Fatal(err)
			}
			wrote := make(chan int, 1)
			go func() {
				n, _ := w.Write(req)
				wrote <- n
			}()
			testkit.Eventually(t, "the request write is in progress", func() bool {
				w.mu.Lock()
				defer w.mu.Unlock()
				return w.writing == writeMessage
			})
			w.abortBlocked(call)
			n := <-wrote
			_ = w.w.Close()
			got, _ := io.ReadAll(r)
			if n != page || !bytes.Equal(got, append(prefill, req[:page]...)) {
				t.Fatalf("the cut wrote %d bytes (the server read %d), want %d: the pipe did not fill as planned", n, len(got)-len(prefill), page)
			}
			if sent, _, _, _, _ := call.state(); sent != tc.wantSent {
				t.Errorf("after a cut at %d of %d bytes the request counts as sent: %v, want %v", n, len(req), sent, tc.wantSent)
			}
		})
	}
}
