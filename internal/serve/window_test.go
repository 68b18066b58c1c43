package serve_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/serve"
)

// recordingListener keeps every byte its connections read and wrote.
type recordingListener struct {
	net.Listener
	mu        sync.Mutex
	read, out bytes.Buffer
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &recordingConn{Conn: c, l: l}, nil
}

type recordingConn struct {
	net.Conn
	l *recordingListener
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.l.record(&c.l.read, p[:n])
	return n, err
}

func (c *recordingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.l.record(&c.l.out, p[:n])
	return n, err
}

func (l *recordingListener) record(to *bytes.Buffer, p []byte) {
	l.mu.Lock()
	to.Write(p)
	l.mu.Unlock()
}

// pings counts the HTTP/2 PING frames in b, a connection's bytes in one
// direction.
func pings(t *testing.T, b []byte) (n int) {
	t.Helper()
	fr := http2.NewFramer(io.Discard, bytes.NewReader(b))
	for {
		f, err := fr.ReadFrame()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return n
		}
		if err != nil {
			t.Fatalf("read frame: %v", err)
		}
		if _, ok := f.(*http2.PingFrame); ok {
			n++
		}
	}
}

// Sparse internal calls carry no flow-control pings: each would cost both
// ends a write and a wakeup per call (gRPC's bandwidth estimator pings on
// nearly every message unless the windows are fixed, as serve fixes them
// on both ends).
func TestSparseCallsSendNoPings(t *testing.T) {
	t.Parallel()
	srv := serve.New("test", slog.New(slog.DiscardHandler), &identity.Guard{Log: slog.New(slog.DiscardHandler)})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingListener{Listener: lis}
	go func() { _ = srv.GRPC.Serve(rec) }()
	t.Cleanup(srv.GRPC.Stop)

	conn, err := serve.Dial(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	client := healthpb.NewHealthClient(conn)
	const calls = 20
	for range calls {
		if _, err := client.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("check: %v", err)
		}
	}
	_ = conn.Close()
	srv.GRPC.Stop()

	rec.mu.Lock()
	defer rec.mu.Unlock()
	in := rec.read.Bytes()
	if !bytes.HasPrefix(in, []byte(http2.ClientPreface)) {
		t.Fatalf("the client did not open with the HTTP/2 preface")
	}
	fromClient, fromServer := pings(t, in[len(http2.ClientPreface):]), pings(t, rec.out.Bytes())
	if fromClient+fromServer > 0 {
		t.Errorf("%d calls sent %d PING frames from the client and %d from the server; want none", calls, fromClient, fromServer)
	}
}
