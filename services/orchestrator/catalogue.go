package orchestrator

import (
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// A task's offered catalogue is compiled, its handles minted and its
// scope registered with policy in package tasks; the request side reads
// it with these.

// offeredCapability returns the named capability of a catalogue, or nil.
func offeredCapability(cat *orchestratorv1.OfferedCatalogue, name string) *orchestratorv1.OfferedCapability {
	for _, oc := range cat.GetOffered() {
		if oc.GetName() == name {
			return oc
		}
	}
	return nil
}

// offeredNames lists the names of a catalogue's offered capabilities.
func offeredNames(cat *orchestratorv1.OfferedCatalogue) []string {
	var out []string
	for _, oc := range cat.GetOffered() {
		out = append(out, oc.GetName())
	}
	return out
}
