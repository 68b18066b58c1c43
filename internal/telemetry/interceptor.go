package telemetry

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// Span attribute keys of governed calls. Values are ids and declared
// names only: an argument value or a credential is never an attribute.
const (
	AttrTask            = "v0m3.task_id"
	AttrRequest         = "v0m3.request_id"
	AttrIntent          = "v0m3.intent_id"
	AttrAttempt         = "v0m3.attempt_id"
	AttrCapability      = "v0m3.capability"
	AttrMappingRevision = "v0m3.mapping_revision"
	AttrOutcome         = "v0m3.outcome"
	AttrReason          = "v0m3.reason"
)

// LimitCodes are the adapter's safe codes of a call cut because a
// mapping's limit broke while the response arrived (adapter.Code*; the
// adapter's tests check they match).
var LimitCodes = map[string]bool{"RESPONSE_LIMIT_EXCEEDED": true, "ITEM_LIMIT_EXCEEDED": true, "MEDIA_TYPE_NOT_ALLOWED": true}

// storeReasons are the ErrorInfo reasons services give when their store
// failed.
var storeReasons = map[string]bool{apierror.ReasonStoreFailure: true, apierror.ReasonStoreUnavailable: true, apierror.ReasonStoreFull: true}

// UnaryServer is the interceptor every V0M3 server runs (outside the
// access guard, so refusals are counted too): it counts the RPC, puts the
// governed call's ids on the server span, and feeds the metrics the
// answer carries (a tool request's outcome, an adapter call's bytes and
// remote time, a budget charge).
func UnaryServer(service string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		method := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
		reason := ""
		if err != nil {
			reason = apierror.Reason(err)
			if storeReasons[reason] {
				StoreErrors.WithLabelValues(service).Inc()
			}
			switch method {
			case "Charge":
				BudgetCharges.WithLabelValues("refused").Inc()
			case "SubmitToolRequest":
				// Refused before a request was answered: the capability is
				// the model's text, so it is not a label.
				GovernedCalls.WithLabelValues("unresolved", "refused", reason).Inc()
			}
		}
		RPCs.WithLabelValues(service, method, status.Code(err).String(), reason).Inc()
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.SetAttributes(attributes(req, resp, reason)...)
		}
		if err == nil {
			observe(service, method, req, resp)
		}
		return resp, err
	}
}

// observe feeds the metrics one successful answer carries.
func observe(service, method string, req, resp any) {
	switch r := resp.(type) {
	case *orchestratorv1.ToolRequest:
		if method == "SubmitToolRequest" || method == "Approve" || method == "Deny" {
			GovernedCalls.WithLabelValues(governedLabels(r)...).Inc()
		}
	case *adapterv1.ExecuteResponse:
		ResponseBytes.Add(float64(r.GetResponseBytes()))
		if code := r.GetError().GetSafeCode(); LimitCodes[code] {
			LimitRefusals.WithLabelValues(code).Inc()
		}
		if d, ok := between(r.GetSendTime(), r.GetObserveTime()); ok {
			StageSeconds.WithLabelValues(service, "remote_call").Observe(d.Seconds())
		}
	case *policyv1.ChargeResponse:
		c, _ := req.(*policyv1.ChargeRequest)
		charged(c)
	case *policyv1.DecideResponse:
		// Decide charges the call itself once every decision allowed it.
		if d, ok := req.(*policyv1.DecideRequest); ok && r.GetCharge() != nil {
			charged(d.GetCharge())
		}
	}
}

// charged counts one charge that policy accepted, by unit.
func charged(c *policyv1.ChargeRequest) {
	BudgetCharges.WithLabelValues("charged").Inc()
	BudgetConsumed.WithLabelValues("calls").Add(float64(c.GetCalls()))
	BudgetConsumed.WithLabelValues("response_bytes").Add(float64(c.GetResponseBytes()))
	BudgetConsumed.WithLabelValues("cost_micros").Add(float64(c.GetCostMicros()))
}

// governedLabels are a tool request's metric labels. The capability is
// the model's text until a mapping resolved it, so only a resolved one is
// a label: cardinality stays that of the declared capabilities.
func governedLabels(r *orchestratorv1.ToolRequest) []string {
	capability := "unresolved"
	if r.GetMappingId() != "" {
		capability = r.GetCapability()
	}
	outcome := strings.ToLower(strings.TrimPrefix(r.GetOutcome().String(), "OUTCOME_"))
	if r.GetOutcome() == adapterv1.Outcome_OUTCOME_UNSPECIFIED {
		outcome = strings.ToLower(strings.TrimPrefix(r.GetState().String(), "REQUEST_STATE_"))
	}
	return []string{capability, outcome, r.GetRefusalReason()}
}

func between(a, b *timestamppb.Timestamp) (time.Duration, bool) {
	if a == nil || b == nil {
		return 0, false
	}
	d := b.AsTime().Sub(a.AsTime())
	return d, d >= 0
}

// The getters governed-call messages share. Requests and answers of every
// service name their ids the same way, so one reading serves them all.
type (
	taskIDer        interface{ GetTaskId() string }
	requestIDer     interface{ GetRequestId() string }
	intentIDer      interface{ GetIntentId() string }
	attemptIDer     interface{ GetAttemptId() string }
	capabilityNamer interface{ GetCapability() string }
	mappingReviser  interface{ GetMappingRevision() int64 }
)

// attributes reads the governed call's ids from an RPC's request and
// answer. A ToolRequest names its own id as Id, read as the request id.
func attributes(msgs ...any) []attribute.KeyValue {
	var kv []attribute.KeyValue
	seen := map[string]bool{}
	add := func(k, v string) {
		if v != "" && !seen[k] {
			seen[k] = true
			kv = append(kv, attribute.String(k, v))
		}
	}
	for _, m := range msgs {
		if r, ok := m.(string); ok { // the error reason
			add(AttrReason, r)
			continue
		}
		if t, ok := m.(*orchestratorv1.ToolRequest); ok {
			add(AttrRequest, t.GetId())
			add(AttrReason, t.GetRefusalReason())
			if o := t.GetOutcome(); o != adapterv1.Outcome_OUTCOME_UNSPECIFIED {
				add(AttrOutcome, strings.ToLower(strings.TrimPrefix(o.String(), "OUTCOME_")))
			}
			if as := t.GetAttempts(); len(as) > 0 {
				add(AttrAttempt, as[len(as)-1].GetId())
			}
		}
		if e, ok := m.(*adapterv1.ExecuteResponse); ok && e.GetOutcome() != adapterv1.Outcome_OUTCOME_UNSPECIFIED {
			add(AttrOutcome, strings.ToLower(strings.TrimPrefix(e.GetOutcome().String(), "OUTCOME_")))
		}
		if v, ok := m.(taskIDer); ok {
			add(AttrTask, v.GetTaskId())
		}
		if v, ok := m.(requestIDer); ok {
			add(AttrRequest, v.GetRequestId())
		}
		if v, ok := m.(intentIDer); ok {
			add(AttrIntent, v.GetIntentId())
		}
		if v, ok := m.(attemptIDer); ok {
			add(AttrAttempt, v.GetAttemptId())
		}
		if v, ok := m.(capabilityNamer); ok && resolved(m) {
			add(AttrCapability, v.GetCapability())
		}
		if v, ok := m.(mappingReviser); ok && v.GetMappingRevision() > 0 && !seen[AttrMappingRevision] {
			seen[AttrMappingRevision] = true
			kv = append(kv, attribute.Int64(AttrMappingRevision, v.GetMappingRevision()))
		}
	}
	return kv
}

// resolved reports whether a message's capability is a declared one: a
// candidate request names what the model wrote, which becomes an
// attribute only once a mapping resolved it.
func resolved(m any) bool {
	switch v := m.(type) {
	case *orchestratorv1.SubmitToolRequestRequest:
		return false
	case *orchestratorv1.ToolRequest:
		return v.GetMappingId() != ""
	}
	return true
}

// stages name the services a caller waits on, by gRPC service.
var stages = map[string]string{
	"v0m3.policy.v1.PolicyService":     "policy",
	"v0m3.adapter.v1.AdapterService":   "adapter",
	"v0m3.evidence.v1.EvidenceService": "evidence",
	"v0m3.registry.v1.RegistryService": "registry",
}

// UnaryClient is the interceptor of a service's clients of its peers: it
// times each call as the stage of the peer it waits on.
func UnaryClient(service string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		start := time.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		svc, _, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
		if stage, ok := stages[svc]; ok {
			StageSeconds.WithLabelValues(service, stage).Observe(time.Since(start).Seconds())
		}
		return err
	}
}

// ClientDialOptions are the dial options that trace and time the calls of
// self (a process outside the suite, e.g. the operator) to V0M3 services.
func ClientDialOptions(self string) []grpc.DialOption {
	return []grpc.DialOption{DialOption(nil), grpc.WithChainUnaryInterceptor(UnaryClient(self))}
}
