package suite_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/redistest"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/policy"
	"github.com/v0m3/v0m3/suite"
)

// BenchmarkGovernedCall measures the store work of one governed call, on
// each store, as calls per second with parallel callers: the intent is
// created (idempotently), the budget charged atomically, the attempt moved
// through SENT to COMMITTED, a trace event appended and the receipt
// recorded. It leaves out the gRPC hops and the remote server so the number
// compares the stores, not the network:
//
//	go test -run '^$' -bench GovernedCall ./suite
func BenchmarkGovernedCall(b *testing.B) {
	b.Run("file", func(b *testing.B) {
		benchGovernedCall(b, suite.FileStores(b.TempDir()))
	})
	b.Run("redis", func(b *testing.B) {
		addr, _ := redistest.Start(b)
		st, err := suite.OpenStores(redisURL(addr, "bench"))
		if err != nil {
			b.Fatal(err)
		}
		benchGovernedCall(b, st)
	})
}

func benchGovernedCall(b *testing.B, stores *suite.Stores) {
	b.Cleanup(func() { _ = stores.Close() })
	o, err := stores.Orchestrator()
	if err != nil {
		b.Fatal(err)
	}
	p, err := stores.Policy()
	if err != nil {
		b.Fatal(err)
	}
	e, err := stores.Evidence()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var workers atomic.Int64
	limit := &policyv1.Budget{MaxCalls: 1 << 50, MaxResponseBytes: 1 << 50, MaxCostMicros: 1 << 50}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := workers.Add(1)
		task := fmt.Sprintf("task_%d", w)
		for i := 0; pb.Next(); i++ {
			id := fmt.Sprintf("req_%d_%d", w, i)
			if _, _, err := o.CreateRequest(ctx, &orchestratorv1.ToolRequest{Id: id, TaskId: task, ProviderCallId: id}); err != nil {
				b.Fatal(err)
			}
			if _, err := p.Charge(ctx, policy.ChargeOp{
				Key:       task + "\x00" + id,
				Task:      &policyv1.Budget{Scope: "task/" + task, MaxCalls: limit.MaxCalls, MaxResponseBytes: limit.MaxResponseBytes, MaxCostMicros: limit.MaxCostMicros},
				Requester: &policyv1.Budget{Scope: fmt.Sprintf("requester/%d", w), MaxCalls: limit.MaxCalls, MaxResponseBytes: limit.MaxResponseBytes, MaxCostMicros: limit.MaxCostMicros},
				Request:   &policyv1.ChargeRequest{TaskId: task, Requester: "alice", Calls: 1, ResponseBytes: 512, IdempotencyKey: id},
			}); err != nil {
				b.Fatal(err)
			}
			for _, stage := range []adapterv1.DeliveryStage{adapterv1.DeliveryStage_DELIVERY_STAGE_SENT, adapterv1.DeliveryStage_DELIVERY_STAGE_COMMITTED} {
				if _, err := o.SaveAttempt(ctx, id, &orchestratorv1.Attempt{Id: "att_" + id, Stage: stage}); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := e.AppendTrace(ctx, &evidencev1.TraceEvent{Id: "ev_" + id, TaskId: task}); err != nil {
				b.Fatal(err)
			}
			if _, _, err := e.CreateReceipt(ctx, &evidencev1.Receipt{Id: "rcpt_" + id, IdempotencyKey: id, TaskId: task}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
}

// BenchmarkInternalRPC measures the floor under every hop of a governed
// call: one internal unary RPC over mutual TLS through the access guard
// and the logging interceptor, as the orchestrator makes them. "small" is
// policy's GetPolicyRevision (a few bytes each way, answered from memory);
// "contract" is the registry's GetCapability (a capability contract with
// its JSON Schema as a protobuf Struct, read from the store). cpu-µs/op
// is the CPU of the whole process (client and server side) per RPC: times
// the RPCs a governed call makes, it bounds how little CPU a call can
// cost.
//
//	go test -run '^$' -bench InternalRPC ./suite
func BenchmarkInternalRPC(b *testing.B) {
	s, err := suite.Start(context.Background(), suite.Config{DataDir: b.TempDir(), Services: []string{suite.Registry, suite.Policy}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	peers, err := s.PeerClients(identity.Orchestrator)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		call func() error
	}{
		{"small", func() error {
			_, err := peers.Policy.GetPolicyRevision(ctx, &policyv1.GetPolicyRevisionRequest{})
			return err
		}},
		{"contract", func() error {
			_, err := peers.Registry.GetCapability(ctx, &registryv1.GetCapabilityRequest{Name: "retrieve_authorized_source"})
			return err
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if err := bc.call(); err != nil {
				b.Fatal(err)
			}
			before := processCPU(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := bc.call(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64((processCPU(b)-before).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
