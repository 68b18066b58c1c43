// Package realnode holds the tests that run MCPServers as real pods: a
// single-node cluster (scripts/realnode.sh: etcd, kube-apiserver, a kubelet,
// kube-controller-manager and kube-scheduler built from source, containerd,
// runc, the CNI bridge and kube-router's NetworkPolicy firewall) with the
// operator reconciling against it and the V0M3 services running in the test
// process.
//
// The node needs root and a Linux host; where it cannot run, the tests say
// so loudly and skip, except under CI (CI set), where they fail.
package realnode
