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
# The install directory name carries every version, so a pin change installs
# afresh and an existing install is reused. The tests compute the same path
# (keep the pins in services/internal/testkit/thirdparty.go in step).
#
# Without Node this prints a loud message and exits 0, so a laptop without
# Node can still run `make test`; in CI (CI set) a missing Node fails.
#
# Environment:
#   V0M3_NPM_CACHE  cache root (default: $HOME/.cache/v0m3/npm)
#   CI              when set and non-empty, a missing node/npm is an error
set -euo pipefail

EVERYTHING_VERSION=2026.8.31
FILESYSTEM_VERSION=2026.8.31
MEMORY_VERSION=2026.8.31
TIME_MCP_VERSION=1.0.6

cache="${V0M3_NPM_CACHE:-${HOME}/.cache/v0m3/npm}"
dir="${cache}/everything-${EVERYTHING_VERSION}_filesystem-${FILESYSTEM_VERSION}_memory-${MEMORY_VERSION}_time-mcp-${TIME_MCP_VERSION}"

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

if [[ -f "${dir}/.installed" ]]; then
	echo "third-party MCP servers already installed in ${dir}"
	exit 0
fi

mkdir -p "${cache}"
tmp="$(mktemp -d "${cache}/.install-XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT

# A private package.json with exact versions: nothing is added to the repo.
cat >"${tmp}/package.json" <<EOF
{
  "name": "v0m3-third-party-mcp",
  "private": true,
  "dependencies": {
    "@modelcontextprotocol/server-everything": "${EVERYTHING_VERSION}",
    "@modelcontextprotocol/server-filesystem": "${FILESYSTEM_VERSION}",
    "@modelcontextprotocol/server-memory": "${MEMORY_VERSION}",
    "time-mcp": "${TIME_MCP_VERSION}"
  }
}
EOF
# --ignore-scripts: installing must not run code from the packages.
npm install --prefix "${tmp}" --save-exact --no-audit --no-fund --ignore-scripts --loglevel=error >&2

for pkg in @modelcontextprotocol/server-everything @modelcontextprotocol/server-filesystem @modelcontextprotocol/server-memory time-mcp; do
	if [[ ! -f "${tmp}/node_modules/${pkg}/dist/index.js" ]]; then
		echo "third-party MCP servers: ${pkg} has no dist/index.js after install" >&2
		exit 1
	fi
done
touch "${tmp}/.installed"
rm -rf "${dir}"
mv "${tmp}" "${dir}"
trap - EXIT
echo "third-party MCP servers installed in ${dir}"
