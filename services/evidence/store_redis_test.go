package evidence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/services/evidence"
)

// Two replicas record observations of one source, each deciding on what
// it last saw of the source's revisions: every observation joins or
// starts the right revision whatever the other replica did meanwhile, a
// write on a right guess takes one round trip, and one on a stale guess
// two (the script refuses it and hands back the state to decide on).
func TestRedisObservationsAcrossReplicas(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	prefix := redistest.Prefix(t)
	type replica struct {
		st evidence.Store
		rt *redistest.RoundTrips
	}
	newReplica := func() replica {
		c := redistest.Client(t, addr)
		rt := &redistest.RoundTrips{}
		c.AddHook(rt)
		return replica{evidence.NewRedisStore(c, prefix), rt}
	}
	a, b := newReplica(), newReplica()
	ctx := context.Background()
	// The first commands of a client also set its connection up and load
	// the script: what is counted below is the steady state.
	for i, r := range []replica{a, b} {
		id := []string{"obs_warm_a", "obs_warm_b"}[i]
		if _, err := r.st.RecordObservation(ctx, &evidencev1.SourceObservation{
			Id: id, ConnectionId: "conn_1", ResourceUri: "notes://warm/" + id, ContentDigest: "sha256:w",
		}, "rev_"+id); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		name           string
		by             replica
		id, content    string
		wantRevision   string // the revision's id: new ones are named after the observation
		wantNumber     int32
		wantRoundTrips int64
	}{
		{"a new source is guessed new", a, "obs_1", "v1", "rev_obs_1", 1, 1},
		{"b does not know a's revision", b, "obs_2", "v2", "rev_obs_2", 2, 2},
		{"a does not know b's", a, "obs_3", "v3", "rev_obs_3", 3, 2},
		{"a knows its own content", a, "obs_4", "v1", "rev_obs_1", 1, 1},
		{"b learns a's content", b, "obs_5", "v1", "rev_obs_1", 1, 2},
		{"b knows it now", b, "obs_6", "v1", "rev_obs_1", 1, 1},
		{"and b knows how many there are", b, "obs_7", "v4", "rev_obs_7", 4, 1},
	} {
		before := step.by.rt.Count()
		got, err := step.by.st.RecordObservation(ctx, &evidencev1.SourceObservation{
			Id: step.id, ConnectionId: "conn_1", TaskId: "task_1", ResourceUri: "notes://a",
			ContentDigest: "sha256:" + step.content, RetrieveTime: timestamppb.New(time.Unix(1700000000, 0)),
		}, "rev_"+step.id)
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got.GetRevisionId() != step.wantRevision || got.GetRevisionNumber() != step.wantNumber {
			t.Errorf("%s: %s joined %s (number %d), want %s (number %d)", step.name, step.id,
				got.GetRevisionId(), got.GetRevisionNumber(), step.wantRevision, step.wantNumber)
		}
		if n := step.by.rt.Count() - before; n != step.wantRoundTrips {
			t.Errorf("%s: %d round trips, want %d", step.name, n, step.wantRoundTrips)
		}
	}

	// An observation id recorded by one replica is refused by the other,
	// and the refusal writes nothing.
	_, err := b.st.RecordObservation(ctx, &evidencev1.SourceObservation{
		Id: "obs_1", ConnectionId: "conn_1", TaskId: "task_1", ResourceUri: "notes://a", ContentDigest: "sha256:v9",
	}, "rev_obs_1_again")
	if !errors.Is(err, store.ErrExists) {
		t.Errorf("recording obs_1 again: %v, want ErrExists", err)
	}
	revs, err := a.st.ListRevisions(ctx, "conn_1", "notes://a")
	if err != nil {
		t.Fatal(err)
	}
	if len(revs) != 4 {
		t.Errorf("%d revisions after the refusal, want 4", len(revs))
	}
	for i, r := range revs {
		if r.GetNumber() != int32(i+1) {
			t.Errorf("revision %d has number %d", i, r.GetNumber())
		}
	}
	list, err := a.st.ListObservations(ctx, "task_1")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 7 {
		t.Errorf("task_1 lists %d observations after the refusal, want 7", len(list))
	}
}
