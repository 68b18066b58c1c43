#!/usr/bin/env bash
# Brings up and tears down a single-node Kubernetes cluster on this host,
# from real parts: etcd and kube-apiserver (the envtest build), a kubelet,
# kube-controller-manager and kube-scheduler built from source at the same
# version, Debian's containerd and runc, the CNI bridge plugin, kube-router's
# firewall enforcing NetworkPolicy, and a registry on loopback serving
# locally built images. The operator's real-node tests (test/realnode)
# run MCPServers on it.
#
# Usage (root only):
#   scripts/realnode.sh install      install the Debian packages the node runs (apt-get install
#                                    containerd runc containernetworking-plugins iptables ipset
#                                    openssl curl), saying so first; nothing when all are present
#   scripts/realnode.sh check        exit 0 if this host can run the node, else say why
#                                    (a missing package is a reason: install installs them)
#   scripts/realnode.sh build        build (once, cached) binaries and images; print the cache dir
#   scripts/realnode.sh up           bring the node up, print its environment (KEY=value lines)
#   scripts/realnode.sh image REPO BINARY PATH [ARG...]
#                                    push an image holding BINARY at PATH to the node's
#                                    registry; print REGISTRY/REPO@sha256:...
#   scripts/realnode.sh env          print the running node's environment
#   scripts/realnode.sh down         stop everything and undo every host change
#
# Every host change `up` makes is recorded under the state directory
# (V0M3_REALNODE_DIR, default /var/lib/v0m3-realnode) before it is made, and
# `down` undoes it: daemons, mounts, pod network namespaces and veths, the
# bridge, cgroups, sysctls the kubelet or CNI set, every directory created
# outside the state directory, and the iptables rules, chains and ipsets
# that appeared since up. `down` is safe to run twice, and after a failed
# `up`.
set -euo pipefail

K8S_VERSION=1.37.2
# kube-router's firewall enforces NetworkPolicy on the node. Built with
# go install at this version, so with exactly the dependencies upstream
# tested (its client libraries are older than the node's).
KUBE_ROUTER=github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@v2.1.0
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$root/tools/realnode"
goos="$(go env GOOS 2>/dev/null || echo linux)"
goarch="$(go env GOARCH 2>/dev/null || echo amd64)"
cache="${V0M3_REALNODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/v0m3/realnode}"
bin="$cache/k8s-$K8S_VERSION-$goos-$goarch"
run="${V0M3_REALNODE_DIR:-/var/lib/v0m3-realnode}"
node_name=v0m3-realnode
bridge=v0m3br0
pod_cidr=10.244.0.0/24
service_cidr=10.96.0.0/24
packages=(containerd runc containernetworking-plugins iptables ipset openssl curl)
cni_bin=/usr/lib/cni
# Sysctls the kubelet (protectKernelDefaults off) and the CNI bridge plugin
# (isGateway) write; their values are restored by down.
sysctls=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
	kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
	net.ipv4.conf.all.forwarding net.bridge.bridge-nf-call-iptables)
# Directories outside the state directory that containerd, runc, the CNI
# library or the kubelet create at fixed paths; down removes those that did
# not exist before up.
fixed_dirs=(/run/containerd /var/lib/cni /var/log/containers /var/log/pods /run/netns /var/run/netns /etc/cni /opt/cni
	/var/lib/kubelet /usr/libexec/kubernetes)

say() { echo "realnode: $*" >&2; }
loud() {
	echo "################################################################" >&2
	for line in "$@"; do echo "### $line" >&2; done
	echo "################################################################" >&2
}

# check reports (exit 1, one reason per line) why this host cannot run the
# node. A missing Debian package is a reason (install installs them; check
# installs nothing). It creates and at once deletes a probe bridge, so it
# too runs only where host changes are allowed.
check() {
	local why=()
	[[ "$(uname -s)" == Linux ]] || why+=("not Linux")
	[[ "$(id -u)" -eq 0 ]] || why+=("not root (the kubelet, containerd and the CNI plugins need root)")
	grep -qw overlay /proc/filesystems || why+=("no overlay filesystem in this kernel")
	[[ -d /sys/fs/cgroup ]] || why+=("no cgroup filesystem at /sys/fs/cgroup")
	ip link add v0m3probe0 type bridge 2>/dev/null && ip link del v0m3probe0 || why+=("cannot create a bridge (no bridge support or CAP_NET_ADMIN)")
	local missing
	missing="$(missing_packages)"
	if [[ -n "$missing" ]]; then
		why+=("missing Debian packages: $missing; install them as root with: V0M3_HOST_TESTS=1 make realnode (it runs scripts/realnode.sh install)")
	fi
	if [[ -f "$run/pids" ]] && alive; then
		why+=("a node is already up (state in $run); run '$0 down' first")
	fi
	if ((${#why[@]})); then
		printf '%s\n' "${why[@]}"
		return 1
	fi
}

# alive reports whether any daemon of a recorded node still runs.
alive() {
	local name pid
	while read -r name pid; do
		kill -0 "$pid" 2>/dev/null && return 0
	done <"$run/pids"
	return 1
}

# missing_packages prints the Debian packages (of packages) whose programs
# are not installed, space-separated; nothing when all are.
missing_packages() {
	local out=()
	command -v containerd >/dev/null || out+=(containerd)
	command -v runc >/dev/null || out+=(runc)
	[[ -x $cni_bin/bridge && -x $cni_bin/host-local && -x $cni_bin/loopback ]] || out+=(containernetworking-plugins)
	command -v iptables-save >/dev/null || out+=(iptables)
	command -v ipset >/dev/null || out+=(ipset)
	command -v openssl >/dev/null || out+=(openssl)
	command -v curl >/dev/null || out+=(curl)
	echo "${out[*]}"
}

# install installs the missing Debian packages with apt-get, saying which
# first. It is the only place anything is installed: up (and so the tests)
# only checks that they are present. A package may start a system-wide
# containerd; the node runs its own.
install() {
	local missing
	missing="$(missing_packages)"
	if [[ -z "$missing" ]]; then
		say "the Debian packages the node runs are installed: ${packages[*]}"
		return 0
	fi
	if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null; then
		say "cannot install $missing: needs root and apt-get; install them by hand"
		return 1
	fi
	say "installing Debian packages with apt-get: $missing"
	# shellcheck disable=SC2086
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing >&2 || {
		say "apt-get install failed; running apt-get update and trying again"
		apt-get update >&2
		# shellcheck disable=SC2086
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing >&2
	}
	missing="$(missing_packages)"
	if [[ -n "$missing" ]]; then
		say "still missing after apt-get install: $missing"
		return 1
	fi
	say "installed"
}

# build compiles the kubelet, kube-controller-manager, kube-scheduler, the
# pause binary, cri-clean and the image tool into a cache directory keyed by
# the version and the wrapper modules' content; later runs check a stamp.
build() {
	local apiserver
	apiserver="$(bash "$root/scripts/envtest.sh")"
	local stamp
	stamp="k8s=$K8S_VERSION kube-router=${KUBE_ROUTER#*@} go=$(go env GOVERSION) wrappers=$(
		cat "$src"/go.mod "$src"/go.sum "$src"/*/main.go "$src"/image/go.{mod,sum} | sha256sum | cut -c1-16
	)"
	fresh() { [[ -f "$bin/.stamp" && "$(cat "$bin/.stamp")" == "$stamp" ]]; }
	if ! fresh; then
		mkdir -p "$cache"
		exec 8>"$cache/.lock"
		# shellcheck source=heartbeat.sh
		source "$root/scripts/heartbeat.sh"
		lock_or_wait 8 realnode
		if ! fresh; then
			local tmp start=$SECONDS
			tmp="$(mktemp -d "$cache/.build.XXXXXX")"
			chmod 755 "$tmp"
			trap 'rm -rf "$tmp"; heartbeat_stop' EXIT
			heartbeat_start realnode
			local minor="${K8S_VERSION#*.}"
			minor="${minor%%.*}"
			local ver="k8s.io/component-base/version"
			say "building kubelet, kube-controller-manager, kube-scheduler v$K8S_VERSION (about 7 min cold on 2 cores after the envtest build)"
			(cd "$src" && CGO_ENABLED=0 go build -trimpath \
				-ldflags="-s -w -X $ver.gitVersion=v$K8S_VERSION -X $ver.gitMajor=1 -X $ver.gitMinor=$minor -X $ver.gitTreeState=clean" \
				-o "$tmp/" ./kubelet ./kube-controller-manager ./kube-scheduler ./pause ./cri-clean ./probe)
			(cd "$src/image" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$tmp/image" .)
			say "building kube-router (its NetworkPolicy controller)"
			(cd "$tmp" && GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath -ldflags='-s -w' "$KUBE_ROUTER")
			echo "$stamp" >"$tmp/.stamp"
			rm -rf "$bin"
			mv "$tmp" "$bin"
			heartbeat_stop
			trap - EXIT
			say "built in $((SECONDS - start)) s into $bin"
		fi
		exec 8>&-
	fi
	echo "$bin"
}

# rules is the host's IPv4 and IPv6 iptables rules, user chains and
# non-default policies, without counters: what differs when anything was
# added (a table that only got loaded, with empty ACCEPT chains, is no
# change).
rules() {
	local t
	for t in iptables ip6tables; do
		command -v "$t-save" >/dev/null || continue
		"$t-save" | sed -E 's/ \[[0-9]+:[0-9]+\]$//' | awk -v t="$t" '
			/^\*/ {table=$0}
			/^-A/ || /^:[^ ]+ -$/ || (/^:/ && $2 != "ACCEPT") {print t, table, $0}'
	done
}

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# record appends an undo step to the journal before the change it undoes.
record() { echo "$*" >>"$run/undo"; }

start_daemon() {
	local name="$1"
	shift
	setsid "$@" >"$run/logs/$name.log" 2>&1 </dev/null &
	echo "$name $!" >>"$run/pids"
}

wait_for() {
	local what="$1" timeout="$2"
	shift 2
	local deadline=$((SECONDS + timeout))
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS > deadline)); then
			say "$what did not come up in $timeout s; last log lines:"
			tail -n 30 "$run/logs/"*.log >&2 || true
			return 1
		fi
		sleep 0.5
	done
}

api() { curl -sf --cacert "$run/pki/ca.crt" --cert "$run/pki/admin.crt" --key "$run/pki/admin.key" "https://127.0.0.1:$(cat "$run/api-port")$1"; }

node_ready() { api "/api/v1/nodes/$node_name" | tr -d ' \n' | grep -q '"type":"Ready","status":"True"'; }

pki() {
	local d="$run/pki"
	mkdir -p "$d"
	chmod 700 "$d"
	(
		cd "$d"
		openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=v0m3-realnode-ca 2>/dev/null
		cert() { # name subject extensions
			openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
			openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 2 -extfile <(printf '%s\n' "$3") 2>/dev/null
		}
		cert apiserver /CN=kube-apiserver "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes.default.svc
extendedKeyUsage=serverAuth"
		# One admin identity for every component: a throwaway single-node
		# cluster for tests, not a production layout.
		cert admin "/O=system:masters/CN=v0m3-realnode-admin" "extendedKeyUsage=clientAuth"
		openssl genrsa -out sa.key 2048 2>/dev/null
		openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
	)
	cat >"$run/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: realnode
  cluster:
    server: https://127.0.0.1:$(cat "$run/api-port")
    certificate-authority: $d/ca.crt
users:
- name: admin
  user:
    client-certificate: $d/admin.crt
    client-key: $d/admin.key
contexts:
- name: realnode
  context: {cluster: realnode, user: admin}
current-context: realnode
EOF
}

configs() {
	local registry="$1"
	mkdir -p "$run/containerd/certs.d/$registry" "$run/cni/net.d" "$run/cni/ipam" "$run/kubelet"
	cat >"$run/containerd/config.toml" <<EOF
version = 2
root = "$run/containerd/root"
state = "$run/containerd/state"
[grpc]
  address = "$run/containerd/containerd.sock"
[ttrpc]
  address = "$run/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$run/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$registry/pause:v0m3"
  # CAP_SYS_RESOURCE is not in this VM's bounding set; without this runc
  # fails to write oom_score_adj.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$cni_bin"
    conf_dir = "$run/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$run/containerd/certs.d"
EOF
	cat >"$run/containerd/certs.d/$registry/hosts.toml" <<EOF
server = "http://$registry"
[host."http://$registry"]
  capabilities = ["pull", "resolve"]
EOF
	# No masquerade: pods need no way out, and the bridge plugin then adds
	# no iptables rules. isGateway gives the host a route to every pod.
	cat >"$run/cni/net.d/10-v0m3.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "v0m3-realnode",
  "plugins": [{
    "type": "bridge",
    "bridge": "$bridge",
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "ranges": [[{"subnet": "$pod_cidr"}]],
      "routes": [{"dst": "0.0.0.0/0"}],
      "dataDir": "$run/cni/ipam"
    }
  }]
}
EOF
	cat >"$run/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This VM has cgroup v1 only; the kubelet refuses it unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$run/containerd/containerd.sock
address: 127.0.0.1
port: $(free_port)
# The node's pods need no host firewall chains (no kube-proxy, no
# masquerade); without this the kubelet adds KUBE-FIREWALL and canary
# chains to the host's iptables.
makeIPTablesUtilChains: false
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $(cat "$run/kubelet-healthz-port")
podLogsDir: $run/pod-logs
volumePluginDir: $run/kubelet/volume-plugins
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $run/pki/ca.crt}
authorization: {mode: AlwaysAllow}
failSwapOn: false
serializeImagePulls: false
# A shared test machine runs near its disk and memory limits; eviction
# would only make the tests flaky.
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
EOF
	cat >"$run/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: $run/kubeconfig}
leaderElection: {leaderElect: false}
EOF
}

env_lines() {
	echo "KUBECONFIG=$run/kubeconfig"
	echo "V0M3_REALNODE_REGISTRY=$(cat "$run/registry")"
	echo "V0M3_REALNODE_NODE=$node_name"
	echo "V0M3_REALNODE_POD_CIDR=$pod_cidr"
	echo "V0M3_REALNODE_DIR=$run"
}

up() {
	local missing
	missing="$(missing_packages)"
	if [[ -n "$missing" ]]; then
		loud "missing Debian packages: $missing" "install them as root with: V0M3_HOST_TESTS=1 make realnode (or scripts/realnode.sh install)"
		return 1
	fi
	build >/dev/null
	local apiserver start=$SECONDS
	apiserver="$(bash "$root/scripts/envtest.sh" --path)"

	mkdir -p "$run/logs"
	: >"$run/undo"
	# Host state before anything changes, for down.
	for s in "${sysctls[@]}"; do
		v="$(sysctl -n "$s" 2>/dev/null)" && record "sysctl $s $v"
	done
	rules >"$run/iptables.before"
	ipset list -n 2>/dev/null | sort >"$run/ipset.before" || true
	for d in "${fixed_dirs[@]}"; do
		[[ -e "$d" ]] || record "rmdir-if-created $d"
	done
	record "link $bridge"
	record "cgroup kubepods"

	local etcd_port etcd_peer registry
	etcd_port="$(free_port)"
	etcd_peer="$(free_port)"
	free_port >"$run/api-port"
	free_port >"$run/kubelet-healthz-port"
	registry="127.0.0.1:$(free_port)"
	echo "$registry" >"$run/registry"
	pki
	configs "$registry"

	start_daemon registry "$bin/image" serve "$registry"
	start_daemon etcd "$apiserver/etcd" --data-dir "$run/etcd" --unsafe-no-fsync \
		--listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
		--listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
		--initial-cluster "default=http://127.0.0.1:$etcd_peer"
	start_daemon containerd containerd --config "$run/containerd/config.toml"
	wait_for registry 30 curl -sf "http://$registry/v2/"
	"$bin/image" push "$registry/pause:v0m3" "$bin/pause" /pause >/dev/null

	start_daemon kube-apiserver "$apiserver/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:$etcd_port" \
		--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$(cat "$run/api-port")" \
		--tls-cert-file "$run/pki/apiserver.crt" --tls-private-key-file "$run/pki/apiserver.key" \
		--client-ca-file "$run/pki/ca.crt" \
		--service-account-issuer https://kubernetes.default.svc \
		--service-account-key-file "$run/pki/sa.pub" --service-account-signing-key-file "$run/pki/sa.key" \
		--service-cluster-ip-range "$service_cidr" --authorization-mode Node,RBAC --allow-privileged=false \
		--endpoint-reconciler-type none
	wait_for kube-apiserver 120 api /readyz

	start_daemon kube-controller-manager "$bin/kube-controller-manager" \
		--kubeconfig "$run/kubeconfig" --authentication-kubeconfig "$run/kubeconfig" --authorization-kubeconfig "$run/kubeconfig" \
		--bind-address 127.0.0.1 --secure-port "$(free_port)" --leader-elect=false \
		--service-account-private-key-file "$run/pki/sa.key" --root-ca-file "$run/pki/ca.crt" \
		--service-cluster-ip-range "$service_cidr" --use-service-account-credentials=false
	start_daemon kube-scheduler "$bin/kube-scheduler" --config "$run/scheduler.yaml" \
		--authentication-kubeconfig "$run/kubeconfig" --authorization-kubeconfig "$run/kubeconfig" \
		--bind-address 127.0.0.1 --secure-port "$(free_port)"
	wait_for containerd 30 test -S "$run/containerd/containerd.sock"
	start_daemon kubelet "$bin/kubelet" --config "$run/kubelet/config.yaml" --kubeconfig "$run/kubeconfig" \
		--root-dir "$run/kubelet/root" --hostname-override "$node_name"
	wait_for "node $node_name Ready" 180 node_ready
	# The CNI bridge ignores NetworkPolicy; kube-router's firewall (iptables
	# and ipset, on the bridge traffic br_netfilter hands to iptables)
	# enforces it. down removes the rules and ipsets it adds (its own
	# --cleanup-config crashes in this version and leaves them).
	local health
	health="$(free_port)"
	start_daemon kube-router "$bin/kube-router" --run-router=false --run-service-proxy=false --run-firewall=true \
		--kubeconfig "$run/kubeconfig" --hostname-override "$node_name" \
		--service-cluster-ip-range "$service_cidr" --health-port "$health" --enable-ipv6=false
	wait_for kube-router 60 curl -sf "http://127.0.0.1:$health/healthz"
	say "up in $((SECONDS - start)) s; state in $run"
	env_lines
}

# undo_cgroup removes name under every cgroup v1 controller (and the
# unified hierarchy), deepest first. Only empty cgroups can go; processes
# are gone by now.
undo_cgroup() {
	local name="$1" base
	for base in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
		[[ -d "$base$name" ]] || continue
		find "$base$name" -depth -type d -exec rmdir {} + 2>/dev/null || true
		[[ -d "$base$name" ]] && say "could not remove cgroup $base$name (still in use?)"
	done
	return 0
}

down() {
	if [[ ! -d "$run" ]]; then
		say "no node state in $run; nothing to undo"
		return 0
	fi
	local failed=0
	# Pods first, through the runtime, so each pod's network (veth, IPAM
	# lease, network namespace) is torn down by the CNI plugin.
	if [[ -f "$run/pids" ]]; then
		pid_of() { awk -v n="$1" '$1==n {print $2}' "$run/pids"; }
		local p
		p="$(pid_of kubelet)"
		[[ -n "$p" ]] && kill "$p" 2>/dev/null && wait_gone "$p"
		if [[ -S "$run/containerd/containerd.sock" && -x "$bin/cri-clean" ]]; then
			"$bin/cri-clean" "unix://$run/containerd/containerd.sock" >&2 || failed=1
		fi
		for name in kube-router kube-scheduler kube-controller-manager kube-apiserver etcd containerd registry; do
			p="$(pid_of "$name")"
			[[ -n "$p" ]] && kill "$p" 2>/dev/null && wait_gone "$p"
		done
		# Shims outlive containerd by design; ours are the ones whose
		# address is under the state directory.
		for p in $(pgrep -f "containerd-shim.*-address $run/" || true); do
			kill "$p" 2>/dev/null && wait_gone "$p"
		done
		rm -f "$run/pids"
	fi
	# Anything still mounted under the state directory (overlay rootfs,
	# secret tmpfs, netns binds), deepest first.
	local m
	for m in $(awk -v r="$run" 'index($2, r) == 1 {print $2}' /proc/self/mounts | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m" || failed=1
	done
	for m in $(awk '$2 ~ "^/(var/)?run/netns/cni-" {print $2}' /proc/self/mounts); do
		umount "$m" && rm -f "$m" || failed=1
	done
	# The real-node tests map MCPServer Service names to pod addresses in a
	# marked block of /etc/hosts (test/realnode); a test binary that died
	# leaves it behind. Rewritten in place: /etc/hosts may be a bind mount.
	if grep -q '^# v0m3-realnode begin' /etc/hosts 2>/dev/null; then
		local kept
		kept="$(awk '/^# v0m3-realnode begin/ {skip=1; next} skip && /^# v0m3-realnode end/ {skip=0; next} !skip' /etc/hosts)"
		printf '%s\n' "$kept" >/etc/hosts
	fi
	if [[ -f "$run/undo" ]]; then
		local op a b
		while read -r op a b; do
			case "$op" in
			sysctl) [[ "$(sysctl -n "$a" 2>/dev/null)" == "$b" ]] || sysctl -qw "$a=$b" || failed=1 ;;
			link) ! ip link show "$a" >/dev/null 2>&1 || ip link del "$a" || failed=1 ;;
			cgroup) undo_cgroup "$a" ;;
			rmdir-if-created) rm -rf "$a" ;;
			esac
		done < <(tac "$run/undo")
	fi
	undo_firewall
	if [[ -f "$run/iptables.before" ]]; then
		if ! diff <(rules) "$run/iptables.before" >/dev/null; then
			say "iptables rules differ from before up; left as they are (rules added since):"
			diff <(rules) "$run/iptables.before" >&2 || true
			failed=1
		fi
	fi
	if [[ -f "$run/ipset.before" ]] && ! diff <(ipset list -n 2>/dev/null | sort) "$run/ipset.before" >/dev/null; then
		say "ipsets differ from before up; left as they are:"
		diff <(ipset list -n 2>/dev/null | sort) "$run/ipset.before" >&2 || true
		failed=1
	fi
	if ((failed)); then
		loud "realnode down: some host changes could not be undone (see above); state kept in $run"
		return 1
	fi
	rm -rf "$run"
	say "down; every recorded host change undone"
}

# undo_firewall deletes the iptables rules, user chains and ipsets that
# appeared since up (the kube-router firewall's), rules first, then chains,
# then the sets they referenced. The daemons are stopped by then.
undo_firewall() {
	[[ -f "$run/iptables.before" ]] || return 0
	local fam table line chain added
	added="$(comm -13 <(sort "$run/iptables.before") <(rules | sort))"
	while read -r fam table line; do
		[[ "$line" == -A* ]] || continue
		eval "$fam -t ${table#\*} -D ${line#-A }" || true
	done <<<"$added"
	while read -r fam table line; do
		[[ "$line" == :* ]] || continue
		chain="${line%% *}"
		"$fam" -t "${table#\*}" -F "${chain#:}" || true
		"$fam" -t "${table#\*}" -X "${chain#:}" || true
	done <<<"$added"
	if [[ -f "$run/ipset.before" ]]; then
		comm -13 "$run/ipset.before" <(ipset list -n 2>/dev/null | sort) | while read -r set; do
			ipset destroy "$set" || true
		done
	fi
}

wait_gone() {
	local i
	for i in $(seq 1 100); do
		kill -0 "$1" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -9 "$1" 2>/dev/null || true
}

case "${1:-}" in
install) install ;;
check) check ;;
build) build ;;
up)
	if ! why="$(check)"; then
		loud "cannot bring up a real node here:" "$why"
		exit 1
	fi
	# A node whose daemons all died (a killed test binary, a reboot) left
	# its host changes recorded: undo them before starting again.
	if [[ -f "$run/undo" ]]; then
		say "undoing the host changes of a node that is no longer running"
		down
	fi
	# Any failing step of up (set -e; -E so functions inherit the trap)
	# tears down what it brought up.
	set -E
	trap 'say "up failed; tearing down what it brought up"; trap - ERR; down || true; exit 1' ERR
	up
	trap - ERR
	;;
image)
	shift
	[[ $# -ge 3 ]] || { echo "usage: $0 image REPO BINARY PATH [ARG...]" >&2; exit 2; }
	repo="$1"
	shift
	"$bin/image" push "$(cat "$run/registry")/$repo:latest" "$@"
	;;
env) env_lines ;;
down) down ;;
*)
	sed -n '2,/^set -e/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
