# dam: run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
NPM ?= npm
INTEROP := internal/interop
STATICCHECK_VERSION ?= v0.8.2
# helm, built from the Go module proxy into bin/ (cached there). The
# Kubernetes version it assumes (helm template, helm lint) is its
# client-go's, 1.37 for v3.22.0, stamped as helm's own Makefile does.
HELM_VERSION ?= v3.22.0
HELM_KUBE_MINOR ?= 37
HELM := bin/helm-$(HELM_VERSION)
CHART := charts/dam
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
test: deps chart rules ## Run every test with -race (starts a throwaway PostgreSQL when none is reachable), lint and render the chart, test the alert rules
	$(GO) vet ./...
	HELM=$(CURDIR)/$(HELM) $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

$(HELM):
	@mkdir -p bin
	GOBIN=$(CURDIR)/bin/.helm-build CGO_ENABLED=0 $(GO) install -trimpath -ldflags "-s -w \
	  -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	  -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$(HELM_KUBE_MINOR) \
	  -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$(HELM_KUBE_MINOR)" \
	  helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	mv bin/.helm-build/helm $@ && rmdir bin/.helm-build

.PHONY: helm
helm: $(HELM) ## Build the pinned helm into bin/ (once)

.PHONY: chart
chart: $(HELM) ## helm lint and helm template the chart with every value set of charts/dam/ci
	@set -e; for f in $(CHART)/ci/*.yaml; do \
	  echo "== $$f"; \
	  $(HELM) lint --strict $(CHART) -f $$f; \
	  $(HELM) template dam $(CHART) -f $$f >/dev/null; \
	done

.PHONY: promtool
promtool: ## Install promtool and prometheus (Debian's prometheus package) when missing
	@command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || ./scripts/install-prometheus.sh

.PHONY: rules
rules: promtool ## Check the alert rules and run their promtool tests
	promtool check rules $(CHART)/alerts/dam.rules.yaml
	promtool test rules $(CHART)/alerts/dam.rules.test.yaml

.PHONY: bench
bench: ## Run the benchmarks and print ratios against same-run baselines (BASE=<rev>: the dam to compare with; PROFILE=1: CPU profiles in bench-profiles/)
	$(GO) run ./internal/benchreport

.PHONY: chaos
chaos: ## Run every chaos scenario at full size through the real binary (about 18 minutes) and print the table (also in chaos.txt)
	@rm -f chaos.txt; status=0; \
	DAM_TEST_CHAOS=full DAM_TEST_CHAOS_TABLE=$(CURDIR)/chaos.txt $(GO) test -count=1 -timeout 80m -run '^TestChaos$$' ./internal/e2e || status=$$?; \
	if [ -f chaos.txt ]; then cat chaos.txt; else echo "chaos: no table written"; fi; exit $$status

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
