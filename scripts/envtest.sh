#!/usr/bin/env bash
# Builds the kube-apiserver and etcd that controller-runtime's envtest starts,
# from source through the Go module proxy, because no prebuilt binaries can be
# downloaded where V0M3 is developed and tested. The build (about ten minutes
# cold on two cores) lands in a cache directory keyed by the versions and by a
# hash of the wrapper modules, so later runs only check a stamp file.
#
# Usage: scripts/envtest.sh          build if needed, print the assets directory
#        scripts/envtest.sh --path   print the assets directory, build nothing
# Tests read the directory from KUBEBUILDER_ASSETS.
set -euo pipefail

K8S_VERSION=1.37.2
ETCD_VERSION=3.7.3
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$root/tools/envtest"
goos="$(go env GOOS)"
goarch="$(go env GOARCH)"
cache="${V0M3_ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/v0m3/envtest}"
dir="$cache/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-$goos-$goarch"

if [[ "${1:-}" == "--path" ]]; then
	echo "$dir"
	exit 0
fi

# The stamp names the versions and the wrapper modules' content, so editing a
# wrapper (or bumping a version) rebuilds instead of reusing a stale binary.
stamp="k8s=$K8S_VERSION etcd=$ETCD_VERSION go=$(go env GOVERSION) wrappers=$(
	cat "$src"/kube-apiserver/{go.mod,go.sum,main.go} "$src"/etcd/{go.mod,go.sum,main.go} | sha256sum | cut -c1-16
)"

fresh() {
	[[ -x "$dir/kube-apiserver" && -x "$dir/etcd" && -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$stamp" ]]
}

if fresh; then
	echo "$dir"
	exit 0
fi

mkdir -p "$cache"
# Two builds at once (make test in two shells) would waste twenty minutes of
# CPU: the second waits for the first and then finds the stamp.
exec 9>"$cache/.lock"
source "$root/scripts/heartbeat.sh"
lock_or_wait 9 envtest
if fresh; then
	echo "$dir"
	exit 0
fi

tmp="$(mktemp -d "$cache/.build.XXXXXX")"
chmod 755 "$tmp"
trap 'rm -rf "$tmp"; heartbeat_stop' EXIT
heartbeat_start envtest
start=$SECONDS

echo "envtest: building etcd v$ETCD_VERSION (about 1.5 min cold)" >&2
(cd "$src/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$tmp/etcd" .)

echo "envtest: building kube-apiserver v$K8S_VERSION (about 10 min cold on 2 cores)" >&2
minor="${K8S_VERSION#*.}"
minor="${minor%%.*}"
ver="k8s.io/component-base/version"
(cd "$src/kube-apiserver" && CGO_ENABLED=0 go build -trimpath \
	-ldflags="-s -w -X $ver.gitVersion=v$K8S_VERSION -X $ver.gitMajor=1 -X $ver.gitMinor=$minor -X $ver.gitTreeState=clean" \
	-o "$tmp/kube-apiserver" .)

echo "$stamp" >"$tmp/.stamp"
rm -rf "$dir"
mv "$tmp" "$dir"
heartbeat_stop
trap - EXIT
echo "envtest: built in $((SECONDS - start)) s into $dir" >&2
echo "$dir"
