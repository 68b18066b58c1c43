// Package controller reconciles MCPServer resources into a sandboxed
// workload (ServiceAccount, Deployment, Service, NetworkPolicy, all owned by
// the MCPServer) and a V0M3 registry connection, and turns a rotation of the
// referenced Secret into a new config revision and a rolled Deployment. It
// also declares Capability and TaskProfile resources as registry
// definitions (definitions.go holds what the two share).
//
// The reconciler is split into small steps in the style of cert-manager:
// each step owns one object or one registry call, records what it saw in a
// condition, and returns an error only when retrying can help, so
// controller-runtime's rate limiter backs off instead of hot-looping.
package controller
