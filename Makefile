# V0M3 Boundary. Everything here works offline once Go modules are
# reachable through the module proxy; tools are Go tool dependencies.
SHELL := /bin/bash
GO    ?= go
BIN   := bin/v0m3
DATA  ?= $(CURDIR)/.v0m3-data

.PHONY: all help build demo run bench test test-all unit tools generate envtest realnode hydra helm breaking check-generate lint vet fmt-check staticcheck fuzz chart third-party-mcp conformance redis clean

all: build

# STEP runs one long step saying what it does, a heartbeat line every
# minute while it runs and how long it took (scripts/step.sh): on a fresh
# machine tool builds, vet and staticcheck are otherwise silent for most of
# an hour.
STEP := bash scripts/step.sh

# Tests that change this host (the real node's iptables rules, bridge,
# sysctls and /etc/hosts block) run only when V0M3_HOST_TESTS=1. Outside CI
# that is the person's explicit choice; under CI (CI set) it defaults to 1,
# so CI keeps running them.
V0M3_HOST_TESTS ?= $(if $(CI),1)
export V0M3_HOST_TESTS

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 18

# The operator copies this binary into arbitrary MCP server images (the stdio
# bridge), so it must not need a libc: CGO_ENABLED=0 links it statically.
# skaffold.yaml builds the image with the same settings.
STATIC := CGO_ENABLED=0
build: ## Build the static v0m3 binary into bin/.
	$(STATIC) $(GO) build -trimpath -o $(BIN) ./cmd/v0m3

demo: build ## Run the first experiment end to end on the embedded store (data and service log kept in a new temporary directory it names).
	$(BIN) demo

run: build ## Serve all five services in one process until interrupted.
	$(BIN) dev --data-dir "$(DATA)"

# BENCH_ARGS are passed to `v0m3 bench` (e.g. --stores file --callers 1,32
# --duration 5s --json bench.json); see `bin/v0m3 bench -h`.
BENCH_ARGS ?=
bench: build redis ## Measure a governed call beside a direct one (issue 14): both transports, both stores, 1 and 32 callers.
	@echo "bench: running $(BIN) bench $(BENCH_ARGS): the five services as one 'v0m3 dev' child on each store, the fixture MCP server over HTTP and stdio; about 3 minutes on 2 cores"
	$(BIN) bench $(BENCH_ARGS)

# The tools are Go tool dependencies (go.mod's tool block): the first
# `go tool X` builds X from source (buf and staticcheck take minutes each
# cold on 2 cores), later ones reuse Go's cache. Building them here, one
# announced step each, keeps that wait out of lint, vet and generate.
TOOLS := buf protoc-gen-go protoc-gen-go-grpc controller-gen staticcheck
tools: ## Build (once, cached by Go) buf, protoc-gen-go, protoc-gen-go-grpc, controller-gen and staticcheck.
	@for t in $(TOOLS); do \
	  $(STEP) "tools: $$t" "go tool $$t --version (builds it from source the first time: minutes cold, instant once cached)" $(GO) tool $$t --version || exit 1; \
	done

generate: tools ## Regenerate protobuf code, deepcopy functions, CRDs, the operator's RBAC and the error reason reference (docs/reference/errors.md).
	@$(STEP) generate "buf generate (protobuf code)" $(GO) tool buf generate
	@$(STEP) generate "the error reason reference (docs/reference/errors.md)" $(GO) run ./internal/apierror/gen
	@$(STEP) generate "controller-gen (deepcopy functions, CRDs, the operator's RBAC)" \
	  $(GO) tool controller-gen paths=./operator/... object \
	  crd:crdVersions=v1 output:crd:artifacts:config=charts/v0m3/crds \
	  rbac:roleName=v0m3-operator output:rbac:artifacts:config=charts/v0m3/templates/operator

envtest: ## Build (once, cached) the kube-apiserver and etcd that the operator's tests start (about 10 min cold).
	@echo "envtest: kube-apiserver and etcd, built from source once, cached under ~/.cache/v0m3 (scripts/envtest.sh)"
	@bash scripts/envtest.sh >/dev/null

# The real-node tests (test/realnode) run MCPServers as pods on a
# single-node cluster scripts/realnode.sh brings up and tears down: root on
# Linux only, and they change the host, so they need V0M3_HOST_TESTS=1
# (set under CI). With it, this target installs the node's Debian packages
# (saying which) and builds its parts; where the node cannot run it says so
# loudly, and under CI fails. The tests install nothing themselves.
REALNODE_PACKAGES := containerd runc containernetworking-plugins iptables ipset openssl curl
realnode: envtest ## With V0M3_HOST_TESTS=1: apt-get install the real node's Debian packages (containerd runc containernetworking-plugins iptables ipset openssl curl) and build (once, cached) its kubelet, controller manager, scheduler and images.
	@if [ "$$V0M3_HOST_TESTS" != 1 ]; then \
	  echo "realnode: the real-node tests change this host (iptables rules, a bridge, sysctls, /etc/hosts) and run only when you opt in; they will be SKIPPED."; \
	  echo "realnode: to run them (root on Linux): V0M3_HOST_TESTS=1 make test (CI sets it); this target then apt-get installs $(REALNODE_PACKAGES)"; \
	  exit 0; \
	fi; \
	echo "realnode: V0M3_HOST_TESTS=1: installing what the real node runs (Debian packages: $(REALNODE_PACKAGES)) and building its parts"; \
	bash scripts/realnode.sh install || true; \
	if why="$$(bash scripts/realnode.sh check)"; then \
	  bash scripts/realnode.sh build >/dev/null; \
	else \
	  echo "################################################################"; \
	  echo "### The real-node tests cannot run here; they will be SKIPPED:"; \
	  echo "$$why" | sed 's/^/###   /'; \
	  echo "### They prove MCPServers become running, sandboxed pods. Run V0M3_HOST_TESTS=1 make test as root on Linux."; \
	  echo "################################################################"; \
	  if [ -n "$$CI" ]; then echo "CI is set: failing"; exit 1; fi; \
	fi

hydra: ## Build (once, cached) the Ory Hydra authorization server that the bearer-token tests start (5-10 min cold).
	@echo "hydra: Ory Hydra, built from source once, cached under ~/.cache/v0m3 (scripts/hydra.sh)"
	@bash scripts/hydra.sh >/dev/null

helm: ## Build (once, cached) the Helm CLI that the chart tests run (a few minutes cold).
	@echo "helm: Helm, built from source once, cached under ~/.cache/v0m3 (scripts/helm.sh)"
	@bash scripts/helm.sh >/dev/null

lint: tools ## buf lint.
	@$(STEP) lint "buf lint (the protobuf contracts)" $(GO) tool buf lint

# API_BASELINE is the commit whose contracts every later change must stay
# compatible with (buf's FILE rules: no removed or renumbered fields, RPCs or
# files; reserve instead). Move it only for a deliberate, announced break.
API_BASELINE ?= 6f1fe3c9a01031b39c934ee71e0305f9ce8c9ac7
breaking: tools ## buf breaking against the API baseline commit.
	@git cat-file -e $(API_BASELINE)^{commit} 2>/dev/null || { echo "API baseline $(API_BASELINE) is not in this clone's history (a shallow clone?); fetch it or set API_BASELINE"; exit 1; }
	@$(STEP) breaking "buf breaking against the API baseline $(API_BASELINE)" $(GO) tool buf breaking --against '.git#ref=$(API_BASELINE)'

check-generate: lint breaking generate ## Fail if generated code differs from what is committed.
	@if [ -n "$$(git status --porcelain -- proto operator/api charts/v0m3 docs/reference)" ]; then \
	  echo "generated code drifted from the committed files; run 'make generate' and commit:"; \
	  git status --porcelain -- proto operator/api charts/v0m3 docs/reference; git diff --stat -- proto operator/api charts/v0m3 docs/reference; exit 1; \
	fi
	@echo "generated code matches the committed files"

vet: ## go vet every package.
	@$(STEP) vet "go vet ./... (compiles every package: many minutes cold on 2 cores, under a minute warm)" $(GO) vet ./...

fmt-check: ## Fail if any Go file needs gofmt.
	@out="$$(gofmt -l cmd services internal suite demo test examples operator proto charts tools)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

staticcheck: tools ## staticcheck every package.
	@$(STEP) staticcheck "staticcheck ./... (analyses every package: many minutes cold, a minute or two warm)" $(GO) tool staticcheck ./...

# An execution count, not a duration: with -fuzztime 10s Go's fuzzing
# coordinator races its own deadline on a loaded machine and fails with
# "context deadline exceeded" and no crasher (stop 23's CI run did).
FUZZTIME ?= 30000x
FUZZ_TARGETS := FuzzHandleToken:./services/policy/ FuzzNormalizeArguments:./services/orchestrator/ \
	FuzzIncomingMessage:./services/adapter/ FuzzPath:./internal/argmap/
fuzz: ## Run each fuzz target for a fixed number of executions.
	@for ft in $(FUZZ_TARGETS); do \
	  $(STEP) "fuzz: $${ft%%:*}" "$(FUZZTIME) executions of $${ft%%:*} in $${ft#*:} (builds an instrumented test binary first)" \
	    $(GO) test -run '^$$' -fuzz "^$${ft%%:*}\$$" -fuzztime $(FUZZTIME) "$${ft#*:}" || exit 1; \
	done

redis: ## Make sure redis-server is installed: apt-get install redis-server when missing (the Redis store tests start their own).
	bash scripts/ensure-redis.sh

third-party-mcp: ## Install (npm ci, cached) the pinned third-party MCP servers the adapter tests run against.
	@$(STEP) third-party-mcp "the pinned third-party MCP servers (npm ci from scripts/npm/third-party-mcp, cached under ~/.cache/v0m3/npm)" bash scripts/third-party-mcp.sh

conformance: ## Install (once, cached) Node 22 and the pinned official MCP conformance runner that test/conformance runs.
	@$(STEP) conformance "Node 22 and the MCP conformance runner (npm ci from scripts/npm/conformance, cached under ~/.cache/v0m3/conformance)" bash scripts/conformance.sh

# The fast loop: needs nothing installed (Go and the module proxy). Every
# test that needs an installed or built part (redis-server, envtest, Hydra,
# Node and the conformance runner, the npm servers, Helm, the real node)
# skips under -short, one line each naming the part; no -race (it slows
# every test several times) and Go's test cache is kept, so a warm rerun
# only runs what changed.
UNIT_TIMEOUT ?= 20m
unit: ## Fast loop: go test -short ./... (no -race, test cache kept); tests needing installed parts skip, saying which.
	@$(STEP) unit "go test -short ./... (tests needing installed parts skip; the first run compiles every test binary)" \
	  $(GO) test -short -timeout $(UNIT_TIMEOUT) ./...

# The full run make test uses: every package with -race and every
# external part installed or built first; under CI nothing skips for a
# missing part (the tests fail instead).
test-all: third-party-mcp conformance redis envtest realnode hydra helm ## Every test with -race and every external part (installed or built first); what make test runs.
	@$(STEP) test-all "go test -race -count=1 -timeout 45m ./... (every package; half an hour or more on 2 cores; a package's output appears when it ends)" \
	  $(GO) test -race -count=1 -timeout 45m ./...

test: check-generate fmt-check vet staticcheck chart test-all fuzz ## Everything CI runs (test-all includes the generated-code drift test).

chart: ## Lint and render the Helm chart with each store (Helm is built once, cached, by scripts/helm.sh).
	@echo "chart: Helm, built from source once, cached under ~/.cache/v0m3 (scripts/helm.sh)"
	@set -e; helm="$$(bash scripts/helm.sh)"; \
	for store in file redis; do \
	  "$$helm" lint --strict charts/v0m3 --set store=$$store; \
	  "$$helm" template v0m3 charts/v0m3 --namespace v0m3-system --set store=$$store >/dev/null; \
	  echo "chart: store=$$store renders"; \
	done

clean:
	rm -rf bin
