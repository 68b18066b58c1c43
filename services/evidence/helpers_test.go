package evidence_test

import (
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/identity/identitytest"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/services/evidence"
)

// env is one evidence server on a real bbolt file, reached over gRPC.
type env struct {
	client evidencev1.EvidenceServiceClient
	server *evidence.Server
	clock  *testkit.Clock
	path   string
	stop   func()
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// newEnv starts a server on a fresh database file.
func newEnv(t *testing.T) *env {
	t.Helper()
	return startEnv(t, filepath.Join(t.TempDir(), "evidence.db"), testkit.NewClock(t0))
}

// startEnv starts a server on the database file at path. stop (also run at
// cleanup) stops the server and closes the file, so a test can reopen it.
func startEnv(t *testing.T, path string, c *testkit.Clock, opts ...func(*evidence.Server)) *env {
	t.Helper()
	db, err := store.Open(path)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	log := slog.New(slog.DiscardHandler)
	srv := evidence.NewServer(evidence.NewBoltStore(db), log).WithClock(c.Now)
	for _, o := range opts {
		o(srv)
	}
	// The orchestrator peer calls: these tests are about the evidence
	// service's own rules, not who may read.
	g := testkit.Serve(t, func(g *grpc.Server) { evidencev1.RegisterEvidenceServiceServer(g, srv) },
		identitytest.ServerOptions(identity.Caller{ID: "orchestrator", Kind: identity.KindService})...)
	conn := g.Dial(t)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			g.Stop()
			if err := db.Close(); err != nil {
				t.Errorf("close store: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &env{client: evidencev1.NewEvidenceServiceClient(conn), server: srv, clock: c, path: path, stop: stop}
}

// contentDigest returns the digest of a piece of test content.
func contentDigest(content string) string { return digest.Bytes([]byte(content)) }

// observation returns a complete, valid observation for task and source.
func observation(task, conn, uri, content string) *evidencev1.SourceObservation {
	return &evidencev1.SourceObservation{
		ConnectionId:    conn,
		SnapshotId:      "snap_" + conn,
		MappingId:       "map_" + conn,
		MappingRevision: 1,
		RequestDigest:   contentDigest("args " + task),
		TaskId:          task,
		RequestId:       "att_" + task,
		ResourceUri:     uri,
		ContentDigest:   contentDigest(content),
		MediaType:       "text/markdown",
		SizeBytes:       int64(len(content)),
		Passages: []*evidencev1.Passage{
			{PassageId: "p1", Text: content, Index: 0},
		},
	}
}

func record(t *testing.T, e *env, o *evidencev1.SourceObservation) *evidencev1.SourceObservation {
	t.Helper()
	out, err := e.client.RecordObservation(t.Context(), &evidencev1.RecordObservationRequest{Observation: o})
	if err != nil {
		t.Fatalf("RecordObservation: %v", err)
	}
	return out
}

// wantError fails unless err has the code and reason and names every field
// in fields among its violations.
func wantError(t *testing.T, err error, code codes.Code, reason string, fields ...string) {
	t.Helper()
	if !apierror.Is(err, code, reason) {
		t.Fatalf("error = %v (reason %q), want %v %s", err, apierror.Reason(err), code, reason)
	}
	got := apierror.Fields(err)
	for _, f := range fields {
		if !slices.Contains(got, f) {
			t.Errorf("field violations %v do not name %q", got, f)
		}
	}
}
