package audit

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// entry says how one privileged RPC becomes a record: its action, and the
// resource and bound revision read from its request and answer.
type entry struct {
	action string
	// read returns resource, revision and detail; resp is nil when the
	// action was refused. ok false means the call is not privileged (an
	// update that changed no credential).
	read func(req, resp any) (resource, revision, detail string, ok bool)
}

// privileged is the one table of RPCs that are audited, by full method.
var privileged = map[string]entry{
	"/v0m3.registry.v1.RegistryService/CreateConnection": {ConnectionCreate, func(req, resp any) (string, string, string, bool) {
		c, _ := resp.(*registryv1.Connection)
		r, _ := req.(*registryv1.CreateConnectionRequest)
		return "connection:" + orPending(c.GetId()), configRevision(c.GetConfigRevision()), "owner " + r.GetOwner(), true
	}},
	"/v0m3.registry.v1.RegistryService/UpdateConnection": {CredentialRotate, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*registryv1.UpdateConnectionRequest)
		if r.GetCredentialRef() == "" && r.GetCredentialVersion() == "" {
			return "", "", "", false
		}
		c, _ := resp.(*registryv1.Connection)
		// The reference and version name where the secret is kept, never
		// the secret itself. A new reference sends the connection back to
		// review (a rotation does not): the record says which it was.
		detail := fmt.Sprintf("credential %s version %s", r.GetCredentialRef(), r.GetCredentialVersion())
		if c.GetReviewState() == registryv1.ReviewState_REVIEW_STATE_PENDING {
			detail += "; connection pending review"
		}
		return "connection:" + r.GetId(), configRevision(c.GetConfigRevision()), detail, true
	}},
	"/v0m3.registry.v1.RegistryService/RetireConnection": {ConnectionRetire, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*registryv1.RetireConnectionRequest)
		c, _ := resp.(*registryv1.Connection)
		return "connection:" + r.GetId(), configRevision(c.GetConfigRevision()), "", true
	}},
	"/v0m3.registry.v1.RegistryService/ReviewConnection": {ConnectionReview, func(req, _ any) (string, string, string, bool) {
		r, _ := req.(*registryv1.ReviewConnectionRequest)
		return "connection:" + r.GetConnectionId(), configRevision(r.GetConfigRevision()), verdict(r.GetApprove()), true
	}},
	"/v0m3.registry.v1.RegistryService/ProposeMapping": {MappingPropose, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*registryv1.ProposeMappingRequest)
		m, _ := resp.(*registryv1.Mapping)
		id := m.GetId()
		if id == "" {
			id = orPending(r.GetMappingId())
		}
		return "mapping:" + id, mappingRevision(m.GetRevision()),
			fmt.Sprintf("capability %s on connection %s", r.GetCapability(), r.GetConnectionId()), true
	}},
	"/v0m3.registry.v1.RegistryService/ReviewMapping": {MappingReview, func(req, _ any) (string, string, string, bool) {
		r, _ := req.(*registryv1.ReviewMappingRequest)
		return "mapping:" + r.GetMappingId(), mappingRevision(r.GetRevision()), verdict(r.GetApprove()), true
	}},
	"/v0m3.orchestrator.v1.OrchestratorService/Approve": {RequestApprove, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*orchestratorv1.ApproveRequest)
		return "request:" + r.GetRequestId(), requestRevision(resp), "", true
	}},
	"/v0m3.orchestrator.v1.OrchestratorService/Deny": {RequestDeny, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*orchestratorv1.DenyRequest)
		return "request:" + r.GetRequestId(), requestRevision(resp), "", true
	}},
	"/v0m3.orchestrator.v1.OrchestratorService/CancelTask": {TaskCancel, func(req, _ any) (string, string, string, bool) {
		r, _ := req.(*orchestratorv1.CancelTaskRequest)
		return "task:" + r.GetId(), "", "", true
	}},
	"/v0m3.orchestrator.v1.OrchestratorService/SettleRequest": {OutcomeSettle, func(req, _ any) (string, string, string, bool) {
		// The note is the settler's free text: the trace keeps it, the
		// audit record names only what was settled.
		r, _ := req.(*orchestratorv1.SettleRequestRequest)
		return "request:" + r.GetRequestId(), "attempt=" + r.GetAttemptId(),
			strings.ToLower(strings.TrimPrefix(r.GetSettlement().String(), "SETTLEMENT_")), true
	}},
	"/v0m3.policy.v1.PolicyService/ReloadPolicy": {PolicyReload, func(_, resp any) (string, string, string, bool) {
		p, _ := resp.(*policyv1.PolicyRevision)
		rev := ""
		if p.GetRevision() != "" {
			rev = "policy_revision=" + p.GetRevision()
		}
		return "policy:default", rev, "", true
	}},
}

// Audited lists the full methods whose calls are audited.
func Audited() []string {
	out := make([]string, 0, len(privileged))
	for m := range privileged {
		out = append(out, m)
	}
	return out
}

// UnaryServer records every call of a privileged RPC that reached its
// handler (the access guard admitted the caller): completed ones with
// outcome "ok", refused ones with their reason. It runs inside the guard,
// so the principal is the verified one.
func UnaryServer(r *Recorder) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		e, ok := privileged[info.FullMethod]
		if !ok || r == nil {
			return resp, err
		}
		var answer any
		if err == nil {
			answer = resp
		}
		resource, revision, detail, audited := e.read(req, answer)
		if audited {
			r.Record(ctx, e.action, resource, revision, err, detail)
		}
		return resp, err
	}
}

// orPending names a resource the refused call would have created.
func orPending(id string) string {
	if id == "" {
		return "(not created)"
	}
	return id
}

func configRevision(n int64) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("config_revision=%d", n)
}

func mappingRevision(n int64) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("mapping_revision=%d", n)
}

// requestRevision is what an approval or denial bound: the mapping and
// policy revisions the request carried.
func requestRevision(resp any) string {
	t, _ := resp.(*orchestratorv1.ToolRequest)
	var parts []string
	if n := t.GetMappingRevision(); n > 0 {
		parts = append(parts, mappingRevision(n))
	}
	if p := t.GetPolicyRevision(); p != "" {
		parts = append(parts, "policy_revision="+p)
	}
	return strings.Join(parts, " ")
}

func verdict(approve bool) string {
	if approve {
		return "approved"
	}
	return "rejected"
}
