package audit

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// entry says how one privileged RPC becomes a record: its action, and the
// resource and bound revision read from its request and answer.
type entry struct {
	action string
	// actionOf, when set, names the action from the request instead (an
	// update is a rotation when it moves the credential).
	actionOf func(req any) string
	// read returns resource, revision and detail; resp is nil when the
	// action was refused. ok false means this call is not to be recorded.
	read func(req, resp any) (resource, revision, detail string, ok bool)
}

// privileged is the one table of RPCs that are audited, by full method.
var privileged = map[string]entry{
	"/v0m3.registry.v1.RegistryService/CreateConnection": {ConnectionCreate, nil, func(req, resp any) (string, string, string, bool) {
		c, _ := resp.(*registryv1.Connection)
		r, _ := req.(*registryv1.CreateConnectionRequest)
		return "connection:" + orPending(c.GetId()), configRevision(c.GetConfigRevision()), "owner " + r.GetOwner(), true
	}},
	"/v0m3.registry.v1.RegistryService/UpdateConnection": {ConnectionUpdate, updateAction, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*registryv1.UpdateConnectionRequest)
		c, _ := resp.(*registryv1.Connection)
		if r.GetCredentialRef() == "" && r.GetCredentialVersion() == "" {
			// Which fields changed, never their values.
			return "connection:" + r.GetId(), configRevision(c.GetConfigRevision()), "changed " + setFields(r, "id", "expected_config_revision", "reason", "keep_serving"), true
		}
		// The reference and version name where the secret is kept, never
		// the secret itself. A new reference sends the connection back to
		// review (a rotation does not): the record says which it was.
		detail := fmt.Sprintf("credential %s version %s", r.GetCredentialRef(), r.GetCredentialVersion())
		if c.GetReviewState() == registryv1.ReviewState_REVIEW_STATE_PENDING {
			detail += "; connection pending review"
		}
		return "connection:" + r.GetId(), configRevision(c.GetConfigRevision()), detail, true
	}},
	"/v0m3.registry.v1.RegistryService/RetireConnection": {ConnectionRetire, nil, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*registryv1.RetireConnectionRequest)
		c, _ := resp.(*registryv1.Connection)
		return "connection:" + r.GetId(), configRevision(c.GetConfigRevision()), "", true
	}},
	"/v0m3.registry.v1.RegistryService/ReviewConnection": {ConnectionReview, nil, func(req, _ any) (string, string, string, bool) {
		r, _ := req.(*registryv1.ReviewConnectionRequest)
		return "connection:" + r.GetConnectionId(), configRevision(r.GetConfigRevision()), verdict(r.GetApprove()), true
	}},
	"/v0m3.registry.v1.RegistryService/ProposeMapping": {MappingPropose, nil, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*registryv1.ProposeMappingRequest)
		m, _ := resp.(*registryv1.Mapping)
		id := m.GetId()
		if id == "" {
			id = orPending(r.GetMappingId())
		}
		return "mapping:" + id, mappingRevision(m.GetRevision()),
			fmt.Sprintf("capability %s on connection %s", r.GetCapability(), r.GetConnectionId()), true
	}},
	"/v0m3.registry.v1.RegistryService/ReviewMapping": {MappingReview, nil, func(req, _ any) (string, string, string, bool) {
		r, _ := req.(*registryv1.ReviewMappingRequest)
		return "mapping:" + r.GetMappingId(), mappingRevision(r.GetRevision()), verdict(r.GetApprove()), true
	}},
	"/v0m3.orchestrator.v1.OrchestratorService/Approve": {RequestApprove, nil, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*orchestratorv1.ApproveRequest)
		return "request:" + r.GetRequestId(), requestRevision(resp), "", true
	}},
	"/v0m3.orchestrator.v1.OrchestratorService/Deny": {RequestDeny, nil, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*orchestratorv1.DenyRequest)
		return "request:" + r.GetRequestId(), requestRevision(resp), "", true
	}},
	"/v0m3.orchestrator.v1.OrchestratorService/CancelTask": {TaskCancel, nil, func(req, _ any) (string, string, string, bool) {
		r, _ := req.(*orchestratorv1.CancelTaskRequest)
		return "task:" + r.GetId(), "", "", true
	}},
	"/v0m3.orchestrator.v1.OrchestratorService/SettleRequest": {OutcomeSettle, nil, func(req, _ any) (string, string, string, bool) {
		// The note is the settler's free text: the trace keeps it, the
		// audit record names only what was settled.
		r, _ := req.(*orchestratorv1.SettleRequestRequest)
		return "request:" + r.GetRequestId(), "attempt=" + r.GetAttemptId(),
			strings.ToLower(strings.TrimPrefix(r.GetSettlement().String(), "SETTLEMENT_")), true
	}},
	"/v0m3.policy.v1.PolicyService/ReloadPolicy": {PolicyReload, nil, func(_, resp any) (string, string, string, bool) {
		p, _ := resp.(*policyv1.PolicyRevision)
		rev := ""
		if p.GetRevision() != "" {
			rev = "policy_revision=" + p.GetRevision()
		}
		return "policy:default", rev, "", true
	}},
	"/v0m3.registry.v1.RegistryService/CreateCapability": {CapabilityWrite, nil, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*registryv1.CreateCapabilityRequest)
		c, _ := resp.(*registryv1.Capability)
		return "capability:" + r.GetCapability().GetName(), definitionRevision("capability", c.GetRevision()), "created", true
	}},
	"/v0m3.registry.v1.RegistryService/UpdateCapability": {CapabilityWrite, nil, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*registryv1.UpdateCapabilityRequest)
		c, _ := resp.(*registryv1.Capability)
		return "capability:" + r.GetCapability().GetName(), definitionRevision("capability", c.GetRevision()), "updated", true
	}},
	"/v0m3.registry.v1.RegistryService/DeprecateCapability": {CapabilityWrite, nil, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*registryv1.DeprecateCapabilityRequest)
		c, _ := resp.(*registryv1.Capability)
		return "capability:" + r.GetName(), definitionRevision("capability", c.GetRevision()), "deprecated", true
	}},
	"/v0m3.registry.v1.RegistryService/CreateTaskProfile": {ProfileWrite, nil, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*registryv1.CreateTaskProfileRequest)
		p, _ := resp.(*registryv1.TaskProfile)
		return "task_profile:" + r.GetProfile().GetName(), definitionRevision("profile", p.GetRevision()), "created", true
	}},
	"/v0m3.registry.v1.RegistryService/UpdateTaskProfile": {ProfileWrite, nil, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*registryv1.UpdateTaskProfileRequest)
		p, _ := resp.(*registryv1.TaskProfile)
		return "task_profile:" + r.GetProfile().GetName(), definitionRevision("profile", p.GetRevision()), "updated", true
	}},
	"/v0m3.registry.v1.RegistryService/DeprecateTaskProfile": {ProfileWrite, nil, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*registryv1.DeprecateTaskProfileRequest)
		p, _ := resp.(*registryv1.TaskProfile)
		return "task_profile:" + r.GetName(), definitionRevision("profile", p.GetRevision()), "deprecated", true
	}},
	"/v0m3.adapter.v1.AdapterService/Discover": {ConnectionDiscover, nil, func(req, resp any) (string, string, string, bool) {
		// Discovery starts the server's process or contacts its endpoint.
		r, _ := req.(*adapterv1.DiscoverRequest)
		snap, _ := resp.(*registryv1.DiscoverySnapshot)
		detail := ""
		if snap.GetId() != "" {
			detail = "snapshot " + snap.GetId()
		}
		return "connection:" + r.GetConnectionId(), configRevision(snap.GetConfigRevision()), detail, true
	}},
	"/v0m3.orchestrator.v1.OrchestratorService/MintMcpToken": {McpTokenMint, nil, func(req, _ any) (string, string, string, bool) {
		// A bearer credential for the task's MCP endpoint: the record
		// names the task, never the token.
		r, _ := req.(*orchestratorv1.MintMcpTokenRequest)
		return "task:" + r.GetTaskId(), "", "", true
	}},
	"/v0m3.evidence.v1.EvidenceService/LinkClaim": {ClaimLink, nil, func(req, resp any) (string, string, string, bool) {
		r, _ := req.(*evidencev1.LinkClaimRequest)
		l, _ := resp.(*evidencev1.ClaimLink)
		rev := ""
		if l.GetRevisionId() != "" {
			rev = "source_revision=" + l.GetRevisionId()
		}
		return "observation:" + r.GetObservationId(), rev, "claim " + r.GetClaimId(), true
	}},
	"/v0m3.evidence.v1.EvidenceService/Prune": {EvidencePrune, nil, func(req, resp any) (string, string, string, bool) {
		// Erasure: the record says how far back and how much went.
		r, _ := req.(*evidencev1.PruneRequest)
		detail := "older than " + r.GetOlderThan().AsDuration().String()
		if p, ok := resp.(*evidencev1.PruneResponse); ok && p != nil {
			detail += fmt.Sprintf(", %d protocol events summarized", p.GetSummarizedEvents())
		}
		return "evidence:traces", "", detail, true
	}},
}

// updateAction is a rotation when an update moves the credential
// reference or version, a plain update otherwise.
func updateAction(req any) string {
	r, _ := req.(*registryv1.UpdateConnectionRequest)
	if r.GetCredentialRef() != "" || r.GetCredentialVersion() != "" {
		return CredentialRotate
	}
	return ConnectionUpdate
}

// setFields names the fields set in m, except those skipped, in field
// order: what an update changed, without any value.
func setFields(m proto.Message, skip ...string) string {
	var names []string
	fields := m.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if !slices.Contains(skip, string(f.Name())) && m.ProtoReflect().Has(f) {
			names = append(names, string(f.Name()))
		}
	}
	if len(names) == 0 {
		return "nothing"
	}
	return strings.Join(names, ", ")
}

func definitionRevision(kind string, n int64) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%s_revision=%d", kind, n)
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
			action := e.action
			if e.actionOf != nil {
				action = e.actionOf(req)
			}
			r.Record(ctx, action, resource, revision, err, detail)
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
