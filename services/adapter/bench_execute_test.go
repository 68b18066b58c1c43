package adapter

import (
	"context"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// BenchmarkExecute measures one governed Execute (grant verified, call
// sent, result checked) against the fixture server over stdio and
// streamable HTTP, one caller at a time and 8 callers at once.
//
//	go test -run '^$' -bench BenchmarkExecute ./services/adapter/
func BenchmarkExecute(b *testing.B) {
	for _, kind := range []string{"stdio", "http"} {
		for _, par := range []int{1, 8} {
			name := kind + "/serial"
			if par > 1 {
				name = kind + "/parallel8"
			}
			b.Run(name, func(b *testing.B) {
				e := newEnv(b)
				conn := e.httpConn(httpURL)
				if kind == "stdio" {
					conn = e.stdioConn("--hostile")
				}
				limits := &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 10, AllowedMediaTypes: []string{"text/markdown"}}
				req := &adapterv1.ExecuteRequest{
					ConnectionId: conn.GetId(), ConfigRevision: conn.GetConfigRevision(), MappingId: "map_1", MappingRevision: 1,
					Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search"},
					Limits: limits, AttemptId: "att_bench",
				}
				var err error
				if req.Arguments, err = structpb.NewStruct(map[string]any{"query": "cursor"}); err != nil {
					b.Fatal(err)
				}
				one := func() {
					resp, err := e.srv.Execute(context.Background(), granted(b, req))
					if err != nil {
						b.Fatal(err)
					}
					if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
						b.Fatalf("outcome %v error %v", resp.GetOutcome(), resp.GetError())
					}
				}
				one() // the first call may open a session; measure the steady state
				b.ResetTimer()
				if par == 1 {
					for b.Loop() {
						one()
					}
					return
				}
				b.SetParallelism(par)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						one()
					}
				})
			})
		}
	}
}
