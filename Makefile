# V0M3 Boundary. Everything here works offline once Go modules are
# reachable through the module proxy; tools are Go tool dependencies.
SHELL := /bin/bash
GO    ?= go
BIN   := bin/v0m3
DATA  ?= $(CURDIR)/.v0m3-data

.PHONY: all build demo run bench test generate envtest realnode hydra breaking check-generate lint vet fmt-check staticcheck unit fuzz chart third-party-mcp conformance redis clean

all: build

# The operator copies this binary into arbitrary MCP server images (the stdio
# bridge), so it must not need a libc: CGO_ENABLED=0 links it statically.
# skaffold.yaml builds the image with the same settings.
STATIC := CGO_ENABLED=0
build: ## Build the static v0m3 binary into bin/.
	$(STATIC) $(GO) build -trimpath -o $(BIN) ./cmd/v0m3

demo: build ## Run the first experiment end to end on the embedded store.
	$(BIN) demo --data-dir "$$(mktemp -d)"

run: build ## Serve all five services in one process until interrupted.
	$(BIN) dev --data-dir "$(DATA)"

# BENCH_ARGS are passed to `v0m3 bench` (e.g. --stores file --callers 1,32
# --duration 5s --json bench.json); see `bin/v0m3 bench -h`.
BENCH_ARGS ?=
bench: build redis ## Measure a governed call beside a direct one (issue 14): both transports, both stores, 1 and 32 callers.
	@echo "bench: running $(BIN) bench $(BENCH_ARGS): the five services as one 'v0m3 dev' child on each store, the fixture MCP server over HTTP and stdio; about 3 minutes on 2 cores"
	$(BIN) bench $(BENCH_ARGS)

generate: ## Regenerate protobuf code, deepcopy functions, CRDs, the operator's RBAC and the error reason reference (docs/reference/errors.md).
	$(GO) tool buf generate
	$(GO) run ./internal/apierror/gen
	$(GO) tool controller-gen paths=./operator/... object \
	  crd:crdVersions=v1 output:crd:artifacts:config=charts/v0m3/crds \
	  rbac:roleName=v0m3-operator output:rbac:artifacts:config=charts/v0m3/templates/operator

envtest: ## Build (once, cached) the kube-apiserver and etcd that the operator's tests start.
	@bash scripts/envtest.sh >/dev/null

# The real-node tests (test/realnode) run MCPServers as pods on a
# single-node cluster scripts/realnode.sh brings up and tears down: root on
# Linux only. Where it cannot run, say so loudly; under CI, fail.
realnode: envtest ## Build (once, cached) the kubelet, controller manager, scheduler and images of the real-node tests.
	@if why="$$(bash scripts/realnode.sh check)"; then \
	  bash scripts/realnode.sh build >/dev/null; \
	else \
	  echo "################################################################"; \
	  echo "### The real-node tests cannot run here; they will be SKIPPED:"; \
	  echo "$$why" | sed 's/^/###   /'; \
	  echo "### They prove MCPServers become running, sandboxed pods. Run make test as root on Linux."; \
	  echo "################################################################"; \
	  if [ -n "$$CI" ]; then echo "CI is set: failing"; exit 1; fi; \
	fi

hydra: ## Build (once, cached) the Ory Hydra authorization server that the bearer-token tests start.
	@bash scripts/hydra.sh >/dev/null

lint: ## buf lint.
	$(GO) tool buf lint

# API_BASELINE is the commit whose contracts every later change must stay
# compatible with (buf's FILE rules: no removed or renumbered fields, RPCs or
# files; reserve instead). Move it only for a deliberate, announced break.
API_BASELINE ?= 6f1fe3c9a01031b39c934ee71e0305f9ce8c9ac7
breaking: ## buf breaking against the API baseline commit.
	@git cat-file -e $(API_BASELINE)^{commit} 2>/dev/null || { echo "API baseline $(API_BASELINE) is not in this clone's history (a shallow clone?); fetch it or set API_BASELINE"; exit 1; }
	$(GO) tool buf breaking --against '.git#ref=$(API_BASELINE)'

check-generate: lint breaking generate ## Fail if generated code differs from what is committed.
	@if [ -n "$$(git status --porcelain -- proto operator/api charts/v0m3 docs/reference)" ]; then \
	  echo "generated code drifted from the committed files; run 'make generate' and commit:"; \
	  git status --porcelain -- proto operator/api charts/v0m3 docs/reference; git diff --stat -- proto operator/api charts/v0m3 docs/reference; exit 1; \
	fi
	@echo "generated code matches the committed files"

vet:
	$(GO) vet ./...

fmt-check:
	@out="$$(gofmt -l cmd services internal suite demo test operator proto charts tools)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

staticcheck:
	$(GO) tool staticcheck ./...

# An execution count, not a duration: with -fuzztime 10s Go's fuzzing
# coordinator races its own deadline on a loaded machine and fails with
# "context deadline exceeded" and no crasher (stop 23's CI run did).
FUZZTIME ?= 30000x
fuzz: ## Run each fuzz target for a fixed number of executions.
	$(GO) test -run '^$$' -fuzz '^FuzzHandleToken$$' -fuzztime $(FUZZTIME) ./services/policy/
	$(GO) test -run '^$$' -fuzz '^FuzzNormalizeArguments$$' -fuzztime $(FUZZTIME) ./services/orchestrator/
	$(GO) test -run '^$$' -fuzz '^FuzzIncomingMessage$$' -fuzztime $(FUZZTIME) ./services/adapter/
	$(GO) test -run '^$$' -fuzz '^FuzzPath$$' -fuzztime $(FUZZTIME) ./internal/argmap/

redis: ## Make sure redis-server is installed (the Redis store tests start their own).
	bash scripts/ensure-redis.sh

third-party-mcp: ## Install the pinned third-party MCP servers the adapter tests run against.
	bash scripts/third-party-mcp.sh

conformance: ## Install (once, cached) Node 22 and the pinned official MCP conformance runner that test/conformance runs.
	bash scripts/conformance.sh

unit: third-party-mcp conformance redis envtest realnode hydra ## go test -race for every package.
	$(GO) test -race -count=1 -timeout 45m ./...

test: check-generate fmt-check vet staticcheck chart unit fuzz ## Everything CI runs (unit includes the generated-code drift test).

chart: ## Lint and render the Helm chart with each store (Helm is built once, cached, by scripts/helm.sh).
	@set -e; helm="$$(bash scripts/helm.sh)"; \
	for store in file redis; do \
	  "$$helm" lint --strict charts/v0m3 --set store=$$store; \
	  "$$helm" template v0m3 charts/v0m3 --namespace v0m3-system --set store=$$store >/dev/null; \
	  echo "chart: store=$$store renders"; \
	done

clean:
	rm -rf bin
