// Package v1alpha1 holds the v0m3.dev/v1alpha1 API: the MCPServer custom
// resource that platform teams apply to run an MCP server in a sandboxed pod
// and register it with the V0M3 registry, and the cluster-scoped Capability
// and TaskProfile resources that declare product capabilities and task
// profiles in the registry beside it.
//
// +kubebuilder:object:generate=true
// +groupName=v0m3.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of every type here.
	GroupVersion = schema.GroupVersion{Group: "v0m3.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme. It
	// uses apimachinery only, so the API package stays cheap to import.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &MCPServer{}, &MCPServerList{},
		&Capability{}, &CapabilityList{}, &TaskProfile{}, &TaskProfileList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
