package audit_test

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"github.com/v0m3/v0m3/internal/audit"
	"github.com/v0m3/v0m3/internal/identity"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// served are the generated descriptors of every V0M3 gRPC service: what
// the servers register, so what a caller can reach.
var served = []grpc.ServiceDesc{
	registryv1.RegistryService_ServiceDesc,
	policyv1.PolicyService_ServiceDesc,
	evidencev1.EvidenceService_ServiceDesc,
	adapterv1.AdapterService_ServiceDesc,
	orchestratorv1.OrchestratorService_ServiceDesc,
}

func servedMethods() []string {
	var out []string
	for _, sd := range served {
		for _, m := range sd.Methods {
			out = append(out, "/"+sd.ServiceName+"/"+m.MethodName)
		}
		for _, st := range sd.Streams {
			out = append(out, "/"+sd.ServiceName+"/"+st.StreamName)
		}
	}
	return out
}

// TestEveryRPCIsClassified: every RPC of every service is either audited
// (in the audit table) or in the reviewed list of reads, peer-internal
// steps and traced task work, with a reason; never both, never neither.
// A new RPC fails here until someone decides which it is.
func TestEveryRPCIsClassified(t *testing.T) {
	t.Parallel()
	audited := audit.Audited()
	unaudited := audit.NotAudited()
	methods := servedMethods()
	if len(methods) < 60 {
		t.Fatalf("found %d RPCs; are the descriptors all listed?", len(methods))
	}
	for _, m := range methods {
		inTable := slices.Contains(audited, m)
		u, listed := unaudited[m]
		switch {
		case inTable && listed:
			t.Errorf("%s is both audited and listed as %s (%s): choose one", m, u.Class, u.Reason)
		case !inTable && !listed:
			t.Errorf("%s is neither audited nor classified: add it to the audit table (internal/audit/interceptor.go) "+
				"if it changes or erases state, or to the reviewed list (coverage.go) with a reason", m)
		case listed && strings.TrimSpace(u.Reason) == "":
			t.Errorf("%s is listed as %s without a reason", m, u.Class)
		}
		if !listed {
			continue
		}
		a, ok := identity.AccessFor(m)
		if !ok {
			t.Errorf("%s is not in the access table", m)
		}
		switch u.Class {
		case audit.Read:
		case audit.Internal:
			// A state change a person or product service can ask for is
			// never a peer's internal step.
			if a.Callers || a.Anyone {
				t.Errorf("%s is listed as peer-internal but the access table admits bearer-token callers", m)
			}
		case audit.Traced:
			if !strings.HasPrefix(m, "/v0m3.orchestrator.v1.OrchestratorService/") {
				t.Errorf("%s is listed as traced task work, which only the orchestrator records", m)
			}
		default:
			t.Errorf("%s has class %q", m, u.Class)
		}
	}
	// Nothing stale: every entry names an RPC that exists.
	for _, m := range audited {
		if !slices.Contains(methods, m) {
			t.Errorf("the audit table names %s, which no service serves", m)
		}
	}
	for m := range unaudited {
		if !slices.Contains(methods, m) {
			t.Errorf("the reviewed list names %s, which no service serves", m)
		}
	}
}
