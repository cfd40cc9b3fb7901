# dam: run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
NPM ?= npm
INTEROP := internal/interop
STATICCHECK_VERSION ?= v0.8.2
# Packages with fuzz targets; `make fuzz` explores each target for FUZZTIME.
FUZZTIME ?= 15s
TEST_TIMEOUT ?= 20m
DEMO_RECORDS ?= 20000

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}'

.PHONY: build
build: ## Build bin/dam
	$(GO) build -o bin/dam ./cmd/dam

.PHONY: deps
deps: $(INTEROP)/node_modules/.package-lock.json ## Download Go modules and install test tools (kcat, kafkajs) when missing
	$(GO) mod download
	@command -v kcat >/dev/null 2>&1 || ./scripts/install-kcat.sh

# kafkajs for the interop test (internal/interop), exactly as its
# package-lock.json pins it; reinstalled when the pin changes.
$(INTEROP)/node_modules/.package-lock.json: $(INTEROP)/package.json $(INTEROP)/package-lock.json
	cd $(INTEROP) && $(NPM) ci --no-audit --no-fund
	@touch $@

.PHONY: test
test: deps ## Run every test with -race (starts a throwaway PostgreSQL when none is reachable)
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

.PHONY: bench
bench: ## Run the benchmarks and print ratios against same-run baselines
	$(GO) run ./internal/benchreport

.PHONY: lint
lint: ## gofmt, go vet and staticcheck (pinned)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

.PHONY: fuzz
fuzz: ## Explore every fuzz target for FUZZTIME each
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$t"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

.PHONY: demo
demo: ## Run the sidecar on embedded defaults (kfake + local PostgreSQL) and show duplicates dropping
	$(GO) run ./cmd/dam demo --records $(DEMO_RECORDS)
