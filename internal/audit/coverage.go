package audit

// Class says why an RPC is not in the audit table.
type Class string

const (
	// Read changes no state.
	Read Class = "read"
	// Internal is a peer-service call (the access table admits no person
	// or product service) that changes state as a step of a workflow an
	// audited or traced call started: the step is no decision of its own.
	Internal Class = "internal"
	// Traced changes the state of one task, by its requester or the
	// product service acting for them, and is recorded in that task's own
	// product trace (which auditors read): product work, not
	// administration.
	Traced Class = "traced"
)

// Unaudited is one RPC outside the audit table: its class and why.
type Unaudited struct {
	Class  Class
	Reason string
}

// notAudited is the reviewed list of every RPC that is not audited, with
// the reason. An RPC that is neither here nor in privileged fails
// TestEveryRPCIsClassified, so a new RPC cannot land unclassified; an RPC
// that changes or erases state at an administrator's or product's will
// belongs in privileged, not here.
var notAudited = map[string]Unaudited{
	// Registry.
	"/v0m3.registry.v1.RegistryService/GetConnection":       {Read, "reads one connection; policy decides who (connection.read)"},
	"/v0m3.registry.v1.RegistryService/ListConnections":     {Read, "reads connections; policy decides who (connection.read)"},
	"/v0m3.registry.v1.RegistryService/ListConfigRevisions": {Read, "reads config revisions; policy decides who (connection.read)"},
	"/v0m3.registry.v1.RegistryService/GetSnapshot":         {Read, "reads one snapshot; policy decides who (snapshot.read)"},
	"/v0m3.registry.v1.RegistryService/ListSnapshots":       {Read, "reads snapshots; policy decides who (snapshot.read)"},
	"/v0m3.registry.v1.RegistryService/DiffSnapshots":       {Read, "computes a diff of two stored snapshots; stores nothing"},
	"/v0m3.registry.v1.RegistryService/GetCapability":       {Read, "reads a declared capability"},
	"/v0m3.registry.v1.RegistryService/ListCapabilities":    {Read, "reads declared capabilities"},
	"/v0m3.registry.v1.RegistryService/GetTaskProfile":      {Read, "reads a declared task profile"},
	"/v0m3.registry.v1.RegistryService/ListTaskProfiles":    {Read, "reads declared task profiles"},
	"/v0m3.registry.v1.RegistryService/GetMapping":          {Read, "reads one mapping; policy decides who (mapping.read)"},
	"/v0m3.registry.v1.RegistryService/ListMappings":        {Read, "reads mappings; policy decides who (mapping.read)"},
	"/v0m3.registry.v1.RegistryService/ResolveMapping":      {Read, "answers whether a mapping revision is current; peers only"},
	"/v0m3.registry.v1.RegistryService/ResolveExecution":    {Read, "reads what an execution needs; the orchestrator only"},
	"/v0m3.registry.v1.RegistryService/WatchEvents":         {Read, "streams stored events; policy decides who (connection.read)"},
	"/v0m3.registry.v1.RegistryService/RecordSnapshot": {Internal, "the adapter records what an audited Discover (or a list_changed " +
		"notification) observed; an immutable observation, and a drift it finds moves mappings to review, which is audited"},
	"/v0m3.registry.v1.RegistryService/ReportSandbox": {Internal, "the adapter records the sandbox it applied to a local " +
		"server an audited Discover or a traced Execute started; an observation that changes no configuration and no revision"},
	"/v0m3.registry.v1.RegistryService/ReportRollout": {Internal, "the operator reports which config revision Kubernetes now " +
		"serves, after an audited update; a fact about the cluster, not a decision"},

	// Policy: decisions the orchestrator asks while running a task, and
	// the task's budget and handles it keeps for it.
	"/v0m3.policy.v1.PolicyService/Eligible":          {Read, "computes a task's offered set; the decision is traced by the orchestrator"},
	"/v0m3.policy.v1.PolicyService/Authorize":         {Read, "a Cedar decision; the calling service traces or audits what it decided"},
	"/v0m3.policy.v1.PolicyService/AuthorizeAction":   {Read, "a Cedar decision; the calling service audits the action it guarded"},
	"/v0m3.policy.v1.PolicyService/Decide":            {Read, "a Cedar decision for a submitted request; traced as POLICY_DECISION"},
	"/v0m3.policy.v1.PolicyService/GetPolicyRevision": {Read, "reads the policy revision in force"},
	"/v0m3.policy.v1.PolicyService/RegisterTask": {Internal, "the orchestrator registers a started task's scope and budget " +
		"with policy; the start is traced as TASK_STARTED"},
	"/v0m3.policy.v1.PolicyService/MintHandle": {Internal, "the orchestrator mints short-lived handles for an offered catalogue; " +
		"the offer is traced as CATALOGUE_OFFERED"},
	"/v0m3.policy.v1.PolicyService/ResolveHandle": {Internal, "the orchestrator resolves a handle the model sent; " +
		"the request it belongs to is traced"},
	"/v0m3.policy.v1.PolicyService/Charge": {Internal, "the orchestrator charges a task's budget per call; " +
		"idempotent per attempt, and the call is traced"},
	"/v0m3.policy.v1.PolicyService/ReportConnectionHealth": {Internal, "the adapter reports observed health; " +
		"an observation feeding eligibility, not a decision"},

	// Evidence: the orchestrator's and adapter's records of what
	// happened. They are the trace; auditing them would record the record.
	"/v0m3.evidence.v1.EvidenceService/RecordObservation":   {Internal, "the orchestrator records a source observation of a traced request; append-only"},
	"/v0m3.evidence.v1.EvidenceService/ValidateObservation": {Read, "checks an observation's fitness; stores nothing"},
	"/v0m3.evidence.v1.EvidenceService/PutAsset":            {Internal, "the orchestrator stores a large result by digest; content-addressed, append-only"},
	"/v0m3.evidence.v1.EvidenceService/RecordReceipt":       {Internal, "the orchestrator stores an adapter-attested receipt; append-only"},
	"/v0m3.evidence.v1.EvidenceService/AppendTrace":         {Internal, "the trace itself, appended by the orchestrator and adapter"},
	"/v0m3.evidence.v1.EvidenceService/AppendTraces":        {Internal, "the trace itself, appended by the orchestrator and adapter"},
	"/v0m3.evidence.v1.EvidenceService/AppendAuditRecord":   {Internal, "the audit log itself: auditing an append would never end"},
	"/v0m3.evidence.v1.EvidenceService/GetObservation":      {Read, "reads one observation; policy decides who (trace.read)"},
	"/v0m3.evidence.v1.EvidenceService/ListObservations":    {Read, "reads a task's observations; policy decides who (trace.read)"},
	"/v0m3.evidence.v1.EvidenceService/ListRevisions":       {Read, "reads a source's revisions; policy decides who (trace.read)"},
	"/v0m3.evidence.v1.EvidenceService/CompareRevisions":    {Read, "compares two stored revisions; stores nothing"},
	"/v0m3.evidence.v1.EvidenceService/GetTrace":            {Read, "reads a task's trace; policy decides who (trace.read)"},
	"/v0m3.evidence.v1.EvidenceService/ClassifyTrace":       {Read, "classifies a stored trace; stores nothing"},
	"/v0m3.evidence.v1.EvidenceService/GetReceipt":          {Read, "reads a receipt; the orchestrator only"},
	"/v0m3.evidence.v1.EvidenceService/GetAsset":            {Read, "reads an asset; policy decides who (trace.read)"},
	"/v0m3.evidence.v1.EvidenceService/ListAuditRecords":    {Read, "reads the audit log; auditors only (audit.read)"},

	// Adapter.
	"/v0m3.adapter.v1.AdapterService/Execute": {Internal, "runs one call under an execution grant the orchestrator signed " +
		"for an approved, traced request; each delivery stage is traced"},
	"/v0m3.adapter.v1.AdapterService/Health": {Read, "reports connection health"},

	// Orchestrator: a task's own work, traced in that task's product layer
	// with its requester and actor.
	"/v0m3.orchestrator.v1.OrchestratorService/StartTask":            {Traced, "traced as TASK_STARTED and CATALOGUE_OFFERED with requester and actor"},
	"/v0m3.orchestrator.v1.OrchestratorService/CompleteTask":         {Traced, "the requester closes its own task; traced as TASK_STATE"},
	"/v0m3.orchestrator.v1.OrchestratorService/SubmitToolRequest":    {Traced, "traced as REQUEST_RECEIVED, POLICY_DECISION and what followed"},
	"/v0m3.orchestrator.v1.OrchestratorService/RefreshHandles":       {Traced, "the requester re-mints its task's handles under current policy; no new authority"},
	"/v0m3.orchestrator.v1.OrchestratorService/GetTask":              {Read, "reads a task; policy decides who (task.read)"},
	"/v0m3.orchestrator.v1.OrchestratorService/ListTasks":            {Read, "reads tasks the caller may read"},
	"/v0m3.orchestrator.v1.OrchestratorService/GetCatalogue":         {Read, "reads a task's offered catalogue"},
	"/v0m3.orchestrator.v1.OrchestratorService/GetRequest":           {Read, "reads a request"},
	"/v0m3.orchestrator.v1.OrchestratorService/ListRequests":         {Read, "reads a task's requests"},
	"/v0m3.orchestrator.v1.OrchestratorService/ListPendingApprovals": {Read, "reads requests waiting for an approver"},
	"/v0m3.orchestrator.v1.OrchestratorService/GetApproval":          {Read, "reads an approval"},
	"/v0m3.orchestrator.v1.OrchestratorService/WatchTask":            {Read, "streams a task's events"},
}

// NotAudited returns the reviewed list of RPCs outside the audit table,
// by full method.
func NotAudited() map[string]Unaudited {
	out := make(map[string]Unaudited, len(notAudited))
	for m, u := range notAudited {
		out[m] = u
	}
	return out
}
