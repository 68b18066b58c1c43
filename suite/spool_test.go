package suite_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/audit"
	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// A privileged action taken while evidence is out is audited even when
// the service that took it stops before evidence is back: the record
// waits in that service's own store (its spool), and the next start
// appends it, once, with the time of the action; nothing stays behind.
// On both stores, with the real services and evidence.
func TestAuditRecordsSurviveARestartDuringAnEvidenceOutage(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"file", "redis"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			var storeURL string
			var spoolLen func() int
			if kind == "redis" {
				addr, _ := redistest.Start(t)
				storeURL = redisURL(addr, "spool")
				c := redistest.Client(t, addr)
				spoolLen = func() int { return int(c.HLen(context.Background(), "{spool:registry}:spool:audit").Val()) }
			} else {
				spoolLen = func() int {
					db, err := store.Open(filepath.Join(dir, "registry.db"))
					if err != nil {
						t.Fatal(err)
					}
					defer db.Close()
					kept, err := db.Spool("audit").List(context.Background())
					if err != nil {
						t.Fatal(err)
					}
					return len(kept)
				}
			}

			// Evidence is out: the registry's peer address answers nobody.
			down, err := suite.Start(context.Background(), suite.Config{DataDir: dir, Store: storeURL,
				Services: []string{suite.Registry, suite.Policy}, Peers: map[string]string{suite.Evidence: "127.0.0.1:1"}})
			if err != nil {
				t.Fatal(err)
			}
			actedAt := time.Now()
			conn, err := down.Registry.CreateConnection(down.As(context.Background(), scenario.Integrator.ID, scenario.Integrator.Groups...),
				&registryv1.CreateConnectionRequest{DisplayName: "Outage", Owner: "platform-team", Transport: scenario.StdioFixture("/bin/true")})
			if err != nil {
				t.Fatalf("create a connection while evidence is out: %v (the action does not depend on its audit record)", err)
			}
			down.Close() // evidence is still out: the record stays in the registry's store
			if n := spoolLen(); n != 1 {
				t.Fatalf("the registry's store keeps %d audit records after it stopped, want the 1 evidence did not take", n)
			}

			up, err := suite.Start(context.Background(), suite.Config{DataDir: dir, Store: storeURL})
			if err != nil {
				t.Fatal(err)
			}
			auditor := up.As(context.Background(), scenario.Auditor.ID, scenario.Auditor.Groups...)
			var got []*evidencev1.AuditRecord
			testkit.Eventually(t, "the audit record of the connection created while evidence was out", func() bool {
				l, err := up.Evidence.ListAuditRecords(auditor, &evidencev1.ListAuditRecordsRequest{Action: audit.ConnectionCreate, PageSize: 100})
				got = l.GetRecords()
				return err == nil && len(got) > 0
			})
			// A later action's record goes through the same queue, in
			// order: once evidence holds it, a second append of the
			// recovered record would have happened too.
			if _, err := up.Registry.RetireConnection(testkit.As(up, scenario.Integrator), &registryv1.RetireConnectionRequest{Id: conn.GetId(), Reason: "outage test done"}); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, "the audit record of the later retirement", func() bool {
				l, err := up.Evidence.ListAuditRecords(auditor, &evidencev1.ListAuditRecordsRequest{Action: audit.ConnectionRetire, PageSize: 100})
				return err == nil && len(l.GetRecords()) > 0
			})
			l, err := up.Evidence.ListAuditRecords(auditor, &evidencev1.ListAuditRecordsRequest{Action: audit.ConnectionCreate, PageSize: 100})
			if err != nil {
				t.Fatal(err)
			}
			if got = l.GetRecords(); len(got) != 1 {
				t.Fatalf("evidence holds %d records of the connection's creation, want 1: %v", len(got), got)
			}
			r := got[0]
			if r.GetPrincipal() != scenario.Integrator.ID || r.GetResource() != "connection:"+conn.GetId() || r.GetOutcome() != audit.OK {
				t.Errorf("record = %v, want the integrator creating %s, ok", r, conn.GetId())
			}
			if at := r.GetActionTime().AsTime(); at.Before(actedAt.Add(-time.Second)) || at.After(actedAt.Add(time.Second)) {
				t.Errorf("the record says the action was taken at %s; it was taken at %s", at, actedAt)
			}
			up.Close()
			if n := spoolLen(); n != 0 {
				t.Errorf("the registry's store still keeps %d audit records after evidence took them", n)
			}
		})
	}
}

// On a shared store, what a stopped replica left in the spool is sent by
// the replicas still running, without waiting for a restart: a registry
// replica takes an action while evidence is out (for it) and stops; a
// registry replica of a running suite appends the record, once.
func TestRunningReplicaSendsWhatAStoppedOneLeft(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	storeURL := redisURL(addr, "rescan")
	c := redistest.Client(t, addr)
	running, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Store: storeURL, SpoolRescan: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(running.Close)

	stopped, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Store: storeURL,
		Services: []string{suite.Registry, suite.Policy}, Peers: map[string]string{suite.Evidence: "127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := stopped.Registry.CreateConnection(stopped.As(context.Background(), scenario.Integrator.ID, scenario.Integrator.Groups...),
		&registryv1.CreateConnectionRequest{DisplayName: "Left behind", Owner: "platform-team", Transport: scenario.StdioFixture("/bin/true")})
	if err != nil {
		t.Fatal(err)
	}
	stopped.Close()

	auditor := running.As(context.Background(), scenario.Auditor.ID, scenario.Auditor.Groups...)
	resource := "connection:" + conn.GetId()
	records := func() int {
		l, err := running.Evidence.ListAuditRecords(auditor, &evidencev1.ListAuditRecordsRequest{Action: audit.ConnectionCreate, Resource: resource, PageSize: 100})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.GetRecords())
	}
	testkit.Eventually(t, "the running replica appending the stopped one's audit record", func() bool { return records() > 0 })
	testkit.Eventually(t, "the spool emptied", func() bool { return c.HLen(context.Background(), "{rescan:registry}:spool:audit").Val() == 0 })
	// Another stopped replica leaves a second record: once the running
	// one appends it, a rescan after the first record left the spool has
	// run, and it would have appended the first again too.
	again, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Store: storeURL,
		Services: []string{suite.Registry, suite.Policy}, Peers: map[string]string{suite.Evidence: "127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	later, err := again.Registry.CreateConnection(testkit.As(again, scenario.Integrator),
		&registryv1.CreateConnectionRequest{DisplayName: "Left behind later", Owner: "platform-team", Transport: scenario.StdioFixture("/bin/true")})
	if err != nil {
		t.Fatal(err)
	}
	again.Close()
	testkit.Eventually(t, "the running replica appending the later record", func() bool {
		l, err := running.Evidence.ListAuditRecords(auditor, &evidencev1.ListAuditRecordsRequest{Action: audit.ConnectionCreate, Resource: "connection:" + later.GetId(), PageSize: 100})
		return err == nil && len(l.GetRecords()) > 0
	})
	if n := records(); n != 1 {
		t.Errorf("evidence holds %d records of the stopped replica's action, want 1", n)
	}
}
