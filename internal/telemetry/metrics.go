package telemetry

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Registry is the process's Prometheus registry: every V0M3 metric, the Go
// runtime and the process. `v0m3 dev` runs five services in one process,
// so metrics that differ by service carry a service label.
var Registry = prometheus.NewRegistry()

// Metric label values are bounded: service and stage names, declared
// capability names, outcome and state enumerations, ErrorInfo reasons
// (constants in code) and gRPC method names (the access table). Never an
// id, an argument or remote text.
var (
	// GovernedCalls counts the requests the orchestrator answered from
	// SubmitToolRequest, Approve and Deny by where they ended.
	GovernedCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "v0m3_governed_calls_total",
		Help: "Governed tool requests answered, by capability (\"unresolved\" before a mapping was found), outcome (the call's outcome, or the request state when nothing ran) and refusal reason.",
	}, []string{"capability", "outcome", "reason"})
	// StageSeconds times the stages of a governed call.
	StageSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "v0m3_stage_duration_seconds",
		Help:    "Time spent per stage of governed calls: policy, registry, adapter and evidence calls made by a service, and the remote call the adapter made to the MCP server.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"service", "stage"})
	// RPCs counts every RPC a V0M3 server answered.
	RPCs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "v0m3_grpc_server_handled_total",
		Help: "RPCs answered, by service, method, gRPC code and ErrorInfo reason (\"\" for success).",
	}, []string{"service", "method", "code", "reason"})
	// StoreErrors counts RPCs that failed because the service's store did.
	StoreErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "v0m3_store_errors_total",
		Help: "RPCs that failed because the service's store (bbolt or Redis) failed.",
	}, []string{"service"})
	// BudgetCharges counts what the policy service charged to budgets.
	BudgetCharges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "v0m3_budget_charges_total",
		Help: "Budget charges the policy service decided, by result (charged or refused).",
	}, []string{"result"})
	// BudgetConsumed sums what was charged, by unit.
	BudgetConsumed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "v0m3_budget_consumed_total",
		Help: "Budget consumed by charges the policy service accepted, by unit (calls, response_bytes, cost_micros).",
	}, []string{"unit"})
	// RegistryEvents counts registry change events by kind: drift
	// (snapshot changed) and review_required among them.
	RegistryEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "v0m3_registry_events_total",
		Help: "Registry change events by kind (e.g. snapshot drift, mapping review required, connection retired).",
	}, []string{"kind"})
	// MCPSessions is the number of open MCP sessions by transport; a stdio
	// session is one server process the adapter runs.
	MCPSessions = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "v0m3_mcp_sessions_open",
		Help: "MCP sessions the adapter holds open, by transport; each stdio session is one running server process.",
	}, []string{"transport"})
	// ResponseBytes sums the bytes the adapter read from MCP servers.
	ResponseBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "v0m3_mcp_response_bytes_total",
		Help: "Response bytes the adapter read from servers for governed calls.",
	})
	// LimitRefusals counts calls cut by a limit while bytes arrived.
	LimitRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "v0m3_limit_refusals_total",
		Help: "Calls the adapter cut because a limit was broken while the response arrived, by safe code.",
	}, []string{"code"})
	// AuditRecords counts audit records appended, by action and outcome.
	AuditRecords = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "v0m3_audit_records_total",
		Help: "Audit records of privileged actions appended, by action and outcome.",
	}, []string{"action", "outcome"})
	// EvidenceBacklog is what waits in a service for evidence to take it
	// (see retryqueue): above zero, evidence is out or refusing writes.
	EvidenceBacklog = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "v0m3_evidence_backlog",
		Help: "Records waiting in a service for the evidence service to take them, by service and kind (audit_record, protocol_trace_event).",
	}, []string{"service", "kind"})
	// EvidenceLost counts what a service had for evidence and dropped.
	EvidenceLost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "v0m3_evidence_records_lost_total",
		Help: "Records a service had for the evidence service and dropped, by service and kind: neither evidence nor the service's own store took them.",
	}, []string{"service", "kind"})
)

func init() {
	Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	Registry.MustRegister(Collectors()...)
}

// Collectors are V0M3's own metrics, for a process that serves another
// registry (the operator's controller-runtime one).
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		GovernedCalls, StageSeconds, RPCs, StoreErrors, waiting,
		BudgetCharges, BudgetConsumed, RegistryEvents, MCPSessions, ResponseBytes, LimitRefusals, AuditRecords,
		EvidenceBacklog, EvidenceLost,
	}
}

// Handler serves the registry in the Prometheus exposition format.
func Handler() http.Handler {
	return promhttp.HandlerFor(Registry, promhttp.HandlerOpts{Registry: Registry})
}

// Waiting is when each tool request now waiting on a person started to
// wait: for an approval, and for the settlement of its unknown outcome.
type Waiting struct {
	Approvals   []time.Time
	Settlements []time.Time
}

// WaitingRequests reads the requests now waiting on a person.
type WaitingRequests func(context.Context) (Waiting, error)

// waitingCollector reads the waiting requests from their owner's store
// at scrape time, so the numbers are right across replicas and restarts.
type waitingCollector struct {
	mu     sync.Mutex
	source WaitingRequests
	now    func() time.Time
}

var (
	approvalsWaitingDesc = prometheus.NewDesc("v0m3_approvals_waiting",
		"Tool requests awaiting approval, as the orchestrator's store holds them at scrape time.", nil, nil)
	approvalOldestDesc = prometheus.NewDesc("v0m3_approval_oldest_wait_seconds",
		"Age of the oldest tool request awaiting approval (0 when none waits).", nil, nil)
	settlementsWaitingDesc = prometheus.NewDesc("v0m3_settlements_waiting",
		"Tool requests whose outcome is unknown and awaits settlement (FAILED / UNKNOWN), as the orchestrator's store holds them at scrape time.", nil, nil)
	settlementOldestDesc = prometheus.NewDesc("v0m3_settlement_oldest_wait_seconds",
		"Time since the oldest unknown outcome awaiting settlement became unknown (0 when none waits).", nil, nil)
	waiting = &waitingCollector{now: time.Now}
)

// ObserveWaiting makes source the process's account of the requests
// waiting on a person (the orchestrator registers its store); nil stops
// it.
func ObserveWaiting(source WaitingRequests) {
	waiting.mu.Lock()
	defer waiting.mu.Unlock()
	waiting.source = source
}

func (c *waitingCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- approvalsWaitingDesc
	ch <- approvalOldestDesc
	ch <- settlementsWaitingDesc
	ch <- settlementOldestDesc
}

func (c *waitingCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	source := c.source
	c.mu.Unlock()
	if source == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w, err := source(ctx)
	if err != nil {
		// A scrape that cannot read the store reports nothing rather than
		// a wrong zero; the store error is counted where it happened.
		return
	}
	now := c.now()
	for _, m := range []struct {
		since         []time.Time
		count, oldest *prometheus.Desc
	}{
		{w.Approvals, approvalsWaitingDesc, approvalOldestDesc},
		{w.Settlements, settlementsWaitingDesc, settlementOldestDesc},
	} {
		oldest := 0.0
		for _, t := range m.since {
			oldest = max(oldest, now.Sub(t).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(m.count, prometheus.GaugeValue, float64(len(m.since)))
		ch <- prometheus.MustNewConstMetric(m.oldest, prometheus.GaugeValue, oldest)
	}
}
