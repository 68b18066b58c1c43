package chart_test

import (
	"path"
	"strings"
	"testing"
)

// TestAdapterCredentialRoots: the adapter reads credentials only under its
// credential root, and each Secret the values name is mounted read-only in
// its connection's directory there, nowhere else.
func TestAdapterCredentialRoots(t *testing.T) {
	bin := helmBinary(t)
	const root = "/var/run/secrets/v0m3/connections"
	m := render(t, bin, "adapter.credentialSecrets.conn_a=search-token", "adapter.credentialSecrets.conn_b=notes-token")
	pod := deployment(t, m, "adapter").Spec.Template.Spec
	c := pod.Containers[0]
	if got := flagValue(t, "adapter", c.Args, "credential-roots"); got != root {
		t.Errorf("adapter --credential-roots=%s, want %s", got, root)
	}
	want := map[string]string{"conn_a": "search-token", "conn_b": "notes-token"}
	secrets := map[string]string{} // volume name -> Secret
	for _, v := range pod.Volumes {
		if v.Secret != nil && strings.HasPrefix(v.Name, "credential-") {
			secrets[v.Name] = v.Secret.SecretName
		}
	}
	mounted := map[string]string{} // connection id -> Secret
	for _, vm := range c.VolumeMounts {
		s, ok := secrets[vm.Name]
		if !ok {
			continue
		}
		if path.Dir(vm.MountPath) != root || !vm.ReadOnly {
			t.Errorf("Secret %s mounted at %s (read-only %v), want read-only in a connection's directory under %s", s, vm.MountPath, vm.ReadOnly, root)
		}
		mounted[path.Base(vm.MountPath)] = s
	}
	for id, s := range want {
		if mounted[id] != s {
			t.Errorf("connection %s: Secret %q mounted, want %q (mounted: %v)", id, mounted[id], s, mounted)
		}
	}
	// Without credentialSecrets nothing is mounted there.
	for _, vm := range deployment(t, render(t, bin), "adapter").Spec.Template.Spec.Containers[0].VolumeMounts {
		if path.Dir(vm.MountPath) == root {
			t.Errorf("by default %s is mounted at %s", vm.Name, vm.MountPath)
		}
	}
}
