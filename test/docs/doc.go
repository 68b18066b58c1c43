// Package docs runs what the documentation tells a reader to run, against
// a real `v0m3 dev`, so an example that stops working fails `make test`:
//
//   - scripts/walkthrough.sh, twice (the second run reuses what the first
//     made), and once against an address nothing serves (it must fail
//     loudly);
//   - the agents in examples/agent-go and examples/agent-ts, each against a
//     task of its own started with mcp_access, through the task's MCP
//     endpoint;
//   - every ```sh fenced block of README.md and docs/*.md (docFiles), in
//     file order.
//
// The test builds bin/v0m3, grpcurl (a tool dependency in go.mod) and the
// Go agent, and starts one `v0m3 dev --port-base 0` (every port free)
// whose data directory is <scratch>/.v0m3-data.
//
// # Documentation blocks
//
// A block runs unless the line immediately before its opening fence is
//
//	<!-- not run: <reason> -->
//
// (for what cannot run here: `make run`, `make test`, a cluster, a real
// OAuth issuer, an interactive session). The blocks of one file run in one
// bash session with `set -eo pipefail`, each sourced in turn, so a variable
// or function one block defines is there in the next; the first command
// that fails fails the test, naming the file and the line of the block's
// opening fence. A command that is meant to fail (to show a refusal) is
// written so the shell does not stop: `! grpcurl …` or `grpcurl … || true`.
//
// Each session starts in a scratch directory laid out like a checkout
// after `make build` and `make run`, so a block written for a reader at
// the repository root runs as written:
//
//	./bin/           the binaries: v0m3, grpcurl, agent-go (also first on PATH)
//	./.v0m3-data/    the running `v0m3 dev`'s data directory (pki/ca.crt is its CA)
//
// and with these environment variables (the CLI verbs read V0M3_<FLAG>):
//
//	PATH                    ./bin first, then the test's PATH
//	V0M3_BIN                the absolute path of the v0m3 binary `v0m3 dev` runs
//	V0M3_DATA_DIR           the absolute path of ./.v0m3-data (`v0m3 token` reads it)
//	V0M3_TLS_CA_FILE        its pki/ca.crt
//	V0M3_ORCHESTRATOR_ADDR  host:port of each service; the ports are free
//	V0M3_REGISTRY_ADDR      ones, not 7400-7404: a block addresses a service
//	V0M3_POLICY_ADDR        as "${V0M3_ORCHESTRATOR_ADDR:-127.0.0.1:7400}" (or
//	V0M3_EVIDENCE_ADDR      through a CLI verb, which reads the variable) to
//	V0M3_ADAPTER_ADDR       run both for a reader and here
//	V0M3_MCP_BASE_URL       https://host:port of the task MCP endpoints
//	V0M3_WALKTHROUGH_DIR    where scripts/walkthrough.sh keeps its files
//
// No other V0M3_* variable of the test's own environment reaches a block,
// the walkthrough or `v0m3 dev`.
//
// # Node
//
// The TypeScript agent needs Node >= 18 and npm: it runs on the Node 22
// `make conformance` installs (else the node on PATH), with the
// @modelcontextprotocol/sdk that examples/agent-ts/package-lock.json pins,
// installed once with `npm ci` into ~/.cache/v0m3/examples
// (V0M3_EXAMPLES_CACHE). Without them the TypeScript agent's test SKIPS
// with a loud message; under CI it fails. jq, which the walkthrough reads
// answers with, is treated the same way.
package docs
