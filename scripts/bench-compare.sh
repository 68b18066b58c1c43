#!/usr/bin/env bash
# Measures `v0m3 bench` at two commits side by side, in one run, and prints
# both tables and the after/before ratios as Markdown, ready for a commit
# message.
#
#   scripts/bench-compare.sh BASE_REF [NEW_REF]
#
# BASE_REF and NEW_REF are built in temporary git worktrees; without
# NEW_REF the work tree as it is (uncommitted changes included) is the
# "after". Both refs must contain `v0m3 bench`.
#
# One harness measures both: the "after" build's `v0m3 bench` (its load
# generator, its fixture MCP server) runs each build as the system under
# test (`--system`), so only the system differs between the two columns.
# The two systems run alternately, one store/transport group at a time,
# and the order flips every group (base first, then new first, ...), so a
# change in machine load falls on both alike. Environment:
#
#   BENCH_STORES       stores to measure (default file,redis)
#   BENCH_TRANSPORTS   transports to measure (default http,stdio)
#   BENCH_ARGS         other `v0m3 bench` flags for both, e.g.
#                      "--callers 1,32 --duration 5s" (default: its defaults)
#   ROUNDS             how many times to go through all groups (default 1);
#                      repeated cells are merged (median percentiles)
#   KEEP               when set, keep the temporary directory (JSON, logs)
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 BASE_REF [NEW_REF]" >&2
	exit 2
fi
base_ref=$1
new_ref=${2:-}
stores=${BENCH_STORES:-file,redis}
transports=${BENCH_TRANSPORTS:-http,stdio}
rounds=${ROUNDS:-1}
read -r -a extra <<<"${BENCH_ARGS:-}"

root=$(git rev-parse --show-toplevel)
cd "$root"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/v0m3-bench-compare-XXXXXX")
# A root adapter runs each stdio server under a uid of its own, which must
# reach the binaries.
chmod 755 "$tmp"
cleanup() {
	for wt in "$tmp/src-base" "$tmp/src-new"; do
		[ -d "$wt" ] && git worktree remove --force "$wt" >/dev/null 2>&1 || true
	done
	if [ -n "${KEEP:-}" ]; then
		echo "kept $tmp" >&2
	else
		rm -rf "$tmp"
	fi
}
trap cleanup EXIT

# build REF NAME: builds v0m3 at REF (a commit) or, with REF empty, from the
# work tree, into $tmp/NAME/v0m3.
build() {
	local ref=$1 name=$2 src=$root
	mkdir -p "$tmp/$name"
	chmod 755 "$tmp/$name"
	if [ -n "$ref" ]; then
		src=$tmp/src-$name
		git worktree add --quiet --detach "$src" "$ref"
	fi
	echo "bench-compare: building v0m3 at ${ref:-the work tree} ($name)" >&2
	(cd "$src" && go build -o "$tmp/$name/v0m3" ./cmd/v0m3)
	if ! "$tmp/$name/v0m3" bench -h >/dev/null 2>&1; then
		echo "bench-compare: ${ref:-the work tree} has no 'v0m3 bench' (it came with a3b0879)" >&2
		exit 1
	fi
}

build "$base_ref" base
build "$new_ref" new
base_desc=$(git rev-parse --short "$base_ref")
if [ -n "$new_ref" ]; then
	new_desc=$(git rev-parse --short "$new_ref")
else
	new_desc="work tree at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo ' + changes')"
fi

before=() after=()
group=0
# run NAME STORE TRANSPORT: one group with one binary.
run() {
	local name=$1 store=$2 transport=$3 out
	out="$tmp/$name-$group.json"
	echo "bench-compare: $name ($store, $transport)" >&2
	"$tmp/new/v0m3" bench --system "$tmp/$name/v0m3" --quiet --stores "$store" --transports "$transport" --json "$out" \
		--work-dir "$tmp/work-$name-$group" "${extra[@]}" >/dev/null
	rm -rf "$tmp/work-$name-$group"
	if [ "$name" = base ]; then before+=("$out"); else after+=("$out"); fi
}

for ((round = 0; round < rounds; round++)); do
	for store in ${stores//,/ }; do
		for transport in ${transports//,/ }; do
			if ((group % 2 == 0)); then
				run base "$store" "$transport"
				run new "$store" "$transport"
			else
				run new "$store" "$transport"
				run base "$store" "$transport"
			fi
			group=$((group + 1))
		done
	done
done

join() {
	local IFS=,
	echo "$*"
}
echo "Measured side by side with scripts/bench-compare.sh on $(nproc) cores ($(date -u +%Y-%m-%dT%H:%MZ)), ${rounds} round(s), alternating:"
echo "before = $base_desc, after = $new_desc; bench flags: ${BENCH_ARGS:-defaults}"
echo
"$tmp/new/v0m3" bench compare --before "$(join "${before[@]}")" --after "$(join "${after[@]}")"
