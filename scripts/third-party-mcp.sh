#!/usr/bin/env bash
# Installs the third-party MCP servers the adapter's and end-to-end tests run against,
# at pinned versions, from the npm registry into a cache directory:
#
#   @modelcontextprotocol/server-everything
#   @modelcontextprotocol/server-filesystem
#   @modelcontextprotocol/server-memory
#   time-mcp (a community server that prints a banner line on stdout
#             before it speaks JSON-RPC)
#
# What is installed is scripts/npm/third-party-mcp: its package.json pins
# the servers and its package-lock.json every package they depend on, each
# with its integrity hash (`npm ci`), so a dependency published later cannot
# change what the tests run. The install directory name carries every
# server's version, and the tests compute the same path (the pins in
# internal/testkit/thirdparty.go are checked against package.json);
# an install made from another lock file is installed again.
#
# Without Node this prints a loud message and exits 0, so a laptop without
# Node can still run `make test`; in CI (CI set) a missing Node fails.
#
# Environment:
#   V0M3_NPM_CACHE  cache root (default: $HOME/.cache/v0m3/npm)
#   CI              when set and non-empty, a missing node/npm is an error
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/npm/third-party-mcp"
pin() { node -p "require(process.argv[1]).dependencies[process.argv[2]]" "${src}/package.json" "$1"; }

loud() {
	echo "################################################################" >&2
	for line in "$@"; do echo "### $line" >&2; done
	echo "################################################################" >&2
}

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	if [[ -n "${CI:-}" ]]; then
		loud "third-party MCP servers: node/npm not found and CI is set." \
			"CI must run the third-party server tests: install Node.js (>= 20)."
		exit 1
	fi
	loud "third-party MCP servers: node/npm NOT FOUND; NOT INSTALLING." \
		"The adapter's third-party server tests will be SKIPPED." \
		"Install Node.js (>= 20) to run them."
	exit 0
fi

cache="${V0M3_NPM_CACHE:-${HOME}/.cache/v0m3/npm}"
dir="${cache}/everything-$(pin @modelcontextprotocol/server-everything)_filesystem-$(pin @modelcontextprotocol/server-filesystem)_memory-$(pin @modelcontextprotocol/server-memory)_time-mcp-$(pin time-mcp)"
lock="$(sha256sum "${src}/package-lock.json" | cut -d' ' -f1)"

if [[ "$(cat "${dir}/.installed" 2>/dev/null)" == "${lock}" ]]; then
	echo "third-party MCP servers already installed in ${dir}"
	exit 0
fi

echo "third-party MCP servers: installing ${src}/package-lock.json from the npm registry (under a minute)..." >&2
mkdir -p "${cache}"
tmp="$(mktemp -d "${cache}/.install-XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT
cp "${src}/package.json" "${src}/package-lock.json" "${tmp}/"
# npm ci installs exactly the lock file (and fails if it does not match
# package.json); --ignore-scripts: installing must not run code from the
# packages.
(cd "${tmp}" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error) >&2

for pkg in @modelcontextprotocol/server-everything @modelcontextprotocol/server-filesystem @modelcontextprotocol/server-memory time-mcp; do
	if [[ ! -f "${tmp}/node_modules/${pkg}/dist/index.js" ]]; then
		echo "third-party MCP servers: ${pkg} has no dist/index.js after install" >&2
		exit 1
	fi
done
echo "${lock}" >"${tmp}/.installed"
rm -rf "${dir}"
mv "${tmp}" "${dir}"
trap - EXIT
echo "third-party MCP servers installed in ${dir}"
