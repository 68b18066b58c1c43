// Package v1alpha1 holds the v0m3.dev/v1alpha1 API: the MCPServer custom
// resource that platform teams apply to run an MCP server in a sandboxed pod
// and register it with the V0M3 registry.
//
// +kubebuilder:object:generate=true
// +groupName=v0m3.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of every type here.
	GroupVersion = schema.GroupVersion{Group: "v0m3.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
