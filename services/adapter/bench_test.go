package adapter

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// BenchmarkRefuse256MiB has a local server send one 256 MiB message while
// the mapping allows 1 MiB, and reports the adapter's peak heap in use
// (sampled while the call runs) next to the heap in use before it: the
// refusal costs about the limit, not the message.
//
//	go test -run '^$' -bench BenchmarkRefuse256MiB ./services/adapter/
func BenchmarkRefuse256MiB(b *testing.B) {
	e := newEnv(b)
	conn := e.stdioConn("--hostile")
	limits := &registryv1.Limits{MaxResponseBytes: 1 << 20, MaxItems: 1}
	s, err := structpb.NewStruct(map[string]any{"bytes": 256 << 20})
	if err != nil {
		b.Fatal(err)
	}
	req := &adapterv1.ExecuteRequest{
		ConnectionId: conn.GetId(), ConfigRevision: conn.GetConfigRevision(), MappingId: "map_1", MappingRevision: 1,
		Target:    &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "flood"},
		Arguments: s, Limits: limits, AttemptId: "att_bench",
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse

	var (
		mu   sync.Mutex
		peak uint64
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			mu.Lock()
			peak = max(peak, ms.HeapInuse)
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	var read int64
	b.ResetTimer()
	for b.Loop() {
		// Each call needs its own grant: a grant is used once.
		resp, err := e.srv.Execute(context.Background(), granted(b, req))
		if err != nil {
			b.Fatal(err)
		}
		if resp.GetError().GetSafeCode() != CodeResponseLimitExceeded {
			b.Fatalf("outcome %v code %q", resp.GetOutcome(), resp.GetError().GetSafeCode())
		}
		read = resp.GetResponseBytes()
	}
	b.StopTimer()
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-inuse-MiB")
	b.ReportMetric(float64(peak-min(peak, base))/(1<<20), "peak-heap-growth-MiB")
	b.ReportMetric(float64(read)/(1<<20), "read-MiB/op")
}
