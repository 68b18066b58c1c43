// Package operator will hold the Kubernetes operator that turns MCPServer
// custom resources into sandboxed workloads and registry connections
// (api/v1alpha1 for the types, controller/ for the reconcilers).
package operator
