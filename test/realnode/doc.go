// Package realnode holds the tests that run MCPServers as real pods: a
// single-node cluster (scripts/realnode.sh: etcd, kube-apiserver, a kubelet,
// kube-controller-manager and kube-scheduler built from source, containerd,
// runc, the CNI bridge and kube-router's NetworkPolicy firewall) with the
// operator reconciling against it and the V0M3 services running in the test
// process.
//
// Bringing the node up changes the host (iptables, a bridge, sysctls, a
// block of /etc/hosts; scripts/realnode.sh down undoes it), so outside CI
// these tests run only with V0M3_HOST_TESTS=1, and never under -short. The
// node needs root, a Linux host and Debian packages that `make realnode`
// installs (scripts/realnode.sh install); the tests install nothing. Where
// the node cannot run, they say so loudly and skip, except under CI (CI
// set), where they fail.
package realnode
