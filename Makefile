# V0M3 Boundary. Everything here works offline once Go modules are
# reachable through the module proxy; tools are Go tool dependencies.
SHELL := /bin/bash
GO    ?= go
BIN   := bin/v0m3
DATA  ?= $(CURDIR)/.v0m3-data

.PHONY: all build demo run test generate check-generate lint vet fmt-check staticcheck unit clean

all: build

build: ## Build the v0m3 binary into bin/.
	$(GO) build -o $(BIN) ./cmd/v0m3

demo: build ## Run the first experiment end to end on the embedded store.
	$(BIN) demo --data-dir "$$(mktemp -d)"

run: build ## Serve all five services in one process until interrupted.
	$(BIN) dev --data-dir "$(DATA)"

generate: ## Regenerate protobuf code with the pinned local plugins.
	$(GO) tool buf generate

lint: ## buf lint.
	$(GO) tool buf lint

check-generate: lint generate ## Fail if generated code differs from what is committed.
	@if [ -n "$$(git status --porcelain -- proto)" ]; then \
	  echo "generated code drifted from the committed files; run 'make generate' and commit:"; \
	  git status --porcelain -- proto; git diff --stat -- proto; exit 1; \
	fi
	@echo "generated code matches the committed files"

vet:
	$(GO) vet ./...

fmt-check:
	@out="$$(gofmt -l cmd services operator proto)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

staticcheck:
	$(GO) tool staticcheck ./...

unit: ## go test -race for every package.
	$(GO) test -race -count=1 -timeout 20m ./...

test: lint fmt-check vet staticcheck unit ## Everything CI runs (unit includes the generated-code drift test).

clean:
	rm -rf bin
