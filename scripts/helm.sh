#!/usr/bin/env bash
# Builds the Helm CLI that lints and renders charts/v0m3, from source through
# the Go module proxy, because no prebuilt binaries can be downloaded where
# V0M3 is developed and tested. The build (a few minutes cold on two cores)
# lands in a cache directory keyed by the version, and a stamp names the
# version, the Go toolchain and a hash of the wrapper module, so later runs
# only check the stamp.
#
# Usage: scripts/helm.sh          build if needed, print the helm binary's path
#        scripts/helm.sh --path   print the helm binary's path, build nothing
# charts/v0m3's test reads the path from V0M3_HELM, or runs `scripts/helm.sh --path`.
set -euo pipefail

HELM_VERSION=4.3.2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$root/tools/helm"
cache="${V0M3_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/v0m3}"
dir="$cache/helm-$HELM_VERSION"
bin="$dir/helm"

if [[ "${1:-}" == "--path" ]]; then
	echo "$bin"
	exit 0
fi

# The stamp names the version and the wrapper module's content, so editing it
# (or bumping the version) rebuilds instead of reusing a stale binary.
stamp="helm=$HELM_VERSION go=$(go env GOVERSION) goos=$(go env GOOS) goarch=$(go env GOARCH) wrapper=$(
	cat "$src"/{go.mod,go.sum} | sha256sum | cut -c1-16
)"

fresh() {
	[[ -x "$bin" && -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$stamp" ]]
}

if fresh; then
	echo "$bin"
	exit 0
fi

mkdir -p "$cache"
# Two builds at once (make test in two shells) would waste CPU: the second
# waits for the first and then finds the stamp.
exec 9>"$cache/.helm.lock"
source "$root/scripts/heartbeat.sh"
lock_or_wait 9 helm
if fresh; then
	echo "$bin"
	exit 0
fi

tmp="$(mktemp -d "$cache/.helm-build.XXXXXX")"
chmod 755 "$tmp"
trap 'rm -rf "$tmp"; heartbeat_stop' EXIT
heartbeat_start helm
start=$SECONDS

echo "helm: building helm v$HELM_VERSION (a few minutes cold)" >&2
ver="helm.sh/helm/v4/internal/version"
(cd "$src" && CGO_ENABLED=0 go build -trimpath \
	-ldflags="-s -w -X $ver.version=v$HELM_VERSION -X $ver.gitTreeState=clean" \
	-o "$tmp/helm" helm.sh/helm/v4/cmd/helm)

echo "$stamp" >"$tmp/.stamp"
rm -rf "$dir"
mv "$tmp" "$dir"
heartbeat_stop
trap - EXIT
echo "helm: built in $((SECONDS - start)) s into $dir" >&2
echo "$bin"
