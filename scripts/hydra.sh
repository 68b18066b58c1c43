#!/usr/bin/env bash
# Builds Ory Hydra, the OAuth 2.0 / OpenID Connect authorization server that
# the bearer-token tests fetch real tokens from (internal/oidctest),
# from source through the Go module proxy, because no prebuilt binaries can be
# downloaded where V0M3 is developed and tested. Hydra keeps its in-memory
# store in SQLite, so this is a cgo build (gcc) with the sqlite tag, as
# Hydra's own release build does. The build (several minutes cold on two
# cores) lands in a cache directory keyed by the version, and a stamp names
# the version, the Go toolchain and a hash of the wrapper module, so later runs
# only check the stamp.
#
# Usage: scripts/hydra.sh          build if needed, print the hydra binary's path
#        scripts/hydra.sh --path   print the hydra binary's path, build nothing
# Tests read the path from V0M3_HYDRA, or run `scripts/hydra.sh --path`.
set -euo pipefail

HYDRA_VERSION=2.3.0
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$root/tools/hydra"
cache="${V0M3_HYDRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/v0m3}"
goos="$(go env GOOS)"
goarch="$(go env GOARCH)"
dir="$cache/hydra-$HYDRA_VERSION-$goos-$goarch"
bin="$dir/hydra"

if [[ "${1:-}" == "--path" ]]; then
	echo "$bin"
	exit 0
fi

# The stamp names the version and the wrapper module's content, so editing it
# (or bumping the version) rebuilds instead of reusing a stale binary.
stamp="hydra=$HYDRA_VERSION go=$(go env GOVERSION) goos=$goos goarch=$goarch wrapper=$(
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
exec 9>"$cache/.hydra.lock"
source "$root/scripts/heartbeat.sh"
lock_or_wait 9 hydra
if fresh; then
	echo "$bin"
	exit 0
fi

tmp="$(mktemp -d "$cache/.hydra-build.XXXXXX")"
chmod 755 "$tmp"
trap 'rm -rf "$tmp"; heartbeat_stop' EXIT
start=$SECONDS

echo "hydra: building Ory Hydra v$HYDRA_VERSION with cgo and SQLite (about 5-10 min cold on 2 cores)" >&2
heartbeat_start hydra

ver="github.com/ory/hydra/v2/driver/config"
(cd "$src" && CGO_ENABLED=1 go build -trimpath \
	-tags sqlite,sqlite_omit_load_extension \
	-ldflags="-s -w -X $ver.Version=v$HYDRA_VERSION" \
	-o "$tmp/hydra" github.com/ory/hydra/v2)

heartbeat_stop
ticker=
echo "$stamp" >"$tmp/.stamp"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "hydra: built in $((SECONDS - start)) s into $dir" >&2
echo "$bin"
