package adapter

import (
	"bytes"
	"errors"
	"io"
	"os"
	"syscall"
	"testing"
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
	eventually(t, "the write is in progress", func() bool {
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
