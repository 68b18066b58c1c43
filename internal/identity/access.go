package identity

import "strings"

// Access says who may call one RPC. Anyone not named is refused before the
// handler runs.
type Access struct {
	// Peers are the services whose certificates may call it.
	Peers []string
	// Callers admits authenticated bearer-token callers (people and product
	// services). What each of them may do is Cedar's decision, made by the
	// handler with the verified identity.
	Callers bool
	// Anyone admits every caller, authenticated or not: health and
	// reflection only.
	Anyone bool
}

// The one table of who may call what. A method missing here is refused.
var table = map[string]map[string]Access{
	"v0m3.orchestrator.v1.OrchestratorService": {
		"*": {Callers: true},
	},
	"v0m3.registry.v1.RegistryService": {
		"CreateConnection":     {Peers: []string{Operator}, Callers: true},
		"UpdateConnection":     {Peers: []string{Operator}, Callers: true},
		"RetireConnection":     {Peers: []string{Operator}, Callers: true},
		"ReportRollout":        {Peers: []string{Operator}},
		"ReviewConnection":     {Callers: true},
		"GetConnection":        {Peers: []string{Orchestrator, Policy, Adapter, Operator, Evidence}, Callers: true},
		"ListConnections":      {Peers: []string{Orchestrator, Policy, Adapter, Operator, Evidence}, Callers: true},
		"ListConfigRevisions":  {Peers: []string{Orchestrator, Policy, Adapter, Operator, Evidence}, Callers: true},
		"RecordSnapshot":       {Peers: []string{Adapter}},
		"GetSnapshot":          {Peers: []string{Orchestrator, Adapter, Policy, Operator}, Callers: true},
		"ListSnapshots":        {Peers: []string{Orchestrator, Adapter, Policy, Operator}, Callers: true},
		"DiffSnapshots":        {Peers: []string{Orchestrator, Adapter, Policy, Operator}, Callers: true},
		"CreateCapability":     {Peers: []string{Operator}, Callers: true},
		"UpdateCapability":     {Peers: []string{Operator}, Callers: true},
		"DeprecateCapability":  {Peers: []string{Operator}, Callers: true},
		"GetCapability":        {Peers: []string{Orchestrator, Policy, Adapter, Operator}, Callers: true},
		"ListCapabilities":     {Peers: []string{Orchestrator, Policy, Adapter, Operator}, Callers: true},
		"CreateTaskProfile":    {Peers: []string{Operator}, Callers: true},
		"UpdateTaskProfile":    {Peers: []string{Operator}, Callers: true},
		"DeprecateTaskProfile": {Peers: []string{Operator}, Callers: true},
		"GetTaskProfile":       {Peers: []string{Orchestrator, Policy, Operator}, Callers: true},
		"ListTaskProfiles":     {Peers: []string{Orchestrator, Policy, Operator}, Callers: true},
		"ProposeMapping":       {Callers: true},
		"ReviewMapping":        {Callers: true},
		"GetMapping":           {Peers: []string{Orchestrator, Policy, Adapter, Operator}, Callers: true},
		"ListMappings":         {Peers: []string{Orchestrator, Policy, Adapter, Operator}, Callers: true},
		"ResolveMapping":       {Peers: []string{Orchestrator, Policy, Adapter}},
		"ResolveExecution":     {Peers: []string{Orchestrator}},
		"WatchEvents":          {Peers: []string{Orchestrator, Operator, Policy, Adapter}, Callers: true},
		// The sandbox the adapter applied: its observation, nobody else's.
		"ReportSandbox": {Peers: []string{Adapter}},
	},
	"v0m3.policy.v1.PolicyService": {
		"Eligible":               {Peers: []string{Orchestrator}},
		"Authorize":              {Peers: []string{Orchestrator, Adapter, Registry, Evidence}},
		"AuthorizeAction":        {Peers: []string{Orchestrator, Adapter, Registry, Evidence}},
		"RegisterTask":           {Peers: []string{Orchestrator}},
		"MintHandle":             {Peers: []string{Orchestrator}},
		"ResolveHandle":          {Peers: []string{Orchestrator}},
		"Charge":                 {Peers: []string{Orchestrator}},
		"Decide":                 {Peers: []string{Orchestrator}},
		"ReportConnectionHealth": {Peers: []string{Adapter}},
		"GetPolicyRevision":      {Peers: []string{Orchestrator, Adapter}, Callers: true},
		"ReloadPolicy":           {Callers: true},
	},
	"v0m3.evidence.v1.EvidenceService": {
		"RecordObservation":   {Peers: []string{Orchestrator}},
		"ValidateObservation": {Peers: []string{Orchestrator}},
		"PutAsset":            {Peers: []string{Orchestrator}},
		"RecordReceipt":       {Peers: []string{Orchestrator}},
		"GetReceipt":          {Peers: []string{Orchestrator}},
		"AppendTrace":         {Peers: []string{Orchestrator, Adapter}},
		"AppendTraces":        {Peers: []string{Orchestrator, Adapter}},
		"GetObservation":      {Peers: []string{Orchestrator}, Callers: true},
		"ListObservations":    {Peers: []string{Orchestrator}, Callers: true},
		"ListRevisions":       {Peers: []string{Orchestrator}, Callers: true},
		"CompareRevisions":    {Peers: []string{Orchestrator}, Callers: true},
		"GetTrace":            {Peers: []string{Orchestrator}, Callers: true},
		"ClassifyTrace":       {Peers: []string{Orchestrator}, Callers: true},
		"GetAsset":            {Peers: []string{Orchestrator}, Callers: true},
		"LinkClaim":           {Peers: []string{Orchestrator}, Callers: true},
		"Prune":               {Callers: true},
		// Privileged actions are recorded by the services that take them.
		"AppendAuditRecord": {Peers: []string{Orchestrator, Registry, Policy, Adapter}},
		"ListAuditRecords":  {Callers: true},
	},
	"v0m3.adapter.v1.AdapterService": {
		"Execute":  {Peers: []string{Orchestrator}},
		"Discover": {Peers: []string{Operator}, Callers: true},
		"Health":   {Peers: []string{Orchestrator, Policy, Operator}, Callers: true},
	},
	"grpc.health.v1.Health":                    {"*": {Anyone: true}},
	"grpc.reflection.v1.ServerReflection":      {"*": {Anyone: true}},
	"grpc.reflection.v1alpha.ServerReflection": {"*": {Anyone: true}},
}

// AccessFor returns who may call the RPC named by its full method
// ("/package.Service/Method"), and false when the table does not name it.
func AccessFor(fullMethod string) (Access, bool) {
	svc, method, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok {
		return Access{}, false
	}
	methods, ok := table[svc]
	if !ok {
		return Access{}, false
	}
	if a, ok := methods[method]; ok {
		return a, true
	}
	a, ok := methods["*"]
	return a, ok
}

// CallersOf returns the peer services that may call some RPC of the gRPC
// service svc (e.g. "v0m3.adapter.v1.AdapterService"): what a network
// policy in front of it must admit.
func CallersOf(svc string) []string {
	seen := map[string]bool{}
	var out []string
	for _, a := range table[svc] {
		for _, p := range a.Peers {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}

// AdmitsCallers reports whether some RPC of the gRPC service svc admits
// bearer-token callers.
func AdmitsCallers(svc string) bool {
	for _, a := range table[svc] {
		if a.Callers {
			return true
		}
	}
	return false
}

// TableMethods lists the full method names the table names explicitly.
func TableMethods() []string {
	var out []string
	for svc, methods := range table {
		for m := range methods {
			if m != "*" {
				out = append(out, "/"+svc+"/"+m)
			}
		}
	}
	return out
}
