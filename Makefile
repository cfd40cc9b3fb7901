# dam: run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
NPM ?= npm
INTEROP := tests/interop
# Redocly CLI lints the check service's OpenAPI document (make lint), as
# tests/apilint's package-lock.json pins it; no telemetry, no update check.
APILINT := tests/apilint
REDOCLY := REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true $(APILINT)/node_modules/.bin/redocly
STATICCHECK_VERSION ?= v0.8.2
# helm, built from the Go module proxy into bin/ (cached there). The
# Kubernetes version it assumes (helm template, helm lint) is its
# client-go's, 1.37 for v3.22.0, stamped as helm's own Makefile does.
HELM_VERSION ?= v3.22.0
HELM_KUBE_MINOR ?= 37
HELM := bin/helm-$(HELM_VERSION)
# goreleaser and syft (its SBOMs), built from the Go module proxy into bin/
# (cached there) as helm is. goreleaser v2.16.0 is the newest that builds
# here: v2.17.0 needs a module the proxy refuses (go.digitalxero.dev/go-msix),
# v2.18 needs Go 1.27.
GORELEASER_VERSION ?= v2.16.0
GORELEASER := bin/goreleaser-$(GORELEASER_VERSION)
SYFT_VERSION ?= v1.57.0
SYFT := bin/syft-$(SYFT_VERSION)/syft
# The check service's Go client (examples/serveclient) is generated from
# serve/openapi.yaml by oapi-codegen (`make generate`); `make lint` checks
# it is current.
OAPI_CODEGEN_VERSION ?= v2.8.2
OAPI_CODEGEN = $(GO) run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@$(OAPI_CODEGEN_VERSION)
SERVECLIENT := examples/serveclient
CHART := charts/dam
# Packages with fuzz targets; `make fuzz` explores each target for FUZZTIME.
FUZZTIME ?= 15s
TEST_TIMEOUT ?= 20m
# The build tag of the test hooks (DAM_TEST_PAUSE_AT, DAM_TEST_CPUPROFILE):
# the tests and make chaos build dam with it; go build ./cmd/dam has none.
TEST_TAGS := damtest
DEMO_RECORDS ?= 20000
# make test-citus: the packages whose tests use a database (pgtest), run on
# a throwaway Citus cluster (a coordinator and two workers per package).
# Citus is built when missing: from CITUS_SRC (a checkout of
# citusdata/citus v13.2.2) or ../shared/citus (scripts/install-citus.sh).
CITUS_TEST_PKGS ?= ./dedup/... ./migrations/... ./explain/... ./serve/... ./pipeline/... \
  ./internal/testutil/pgcitus/... ./internal/testutil/pgtest/... ./cmd/dam/... ./examples/serveclient/... \
  ./tests/e2e/... ./tests/interop/... ./tests/observe/... ./internal/cmd/servebench/... \
  ./tests/citusplan/...
CITUS_TEST_TIMEOUT ?= 40m

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-17s\033[0m %s\n", $$1, $$2}'

.PHONY: build
build: ## Build bin/dam
	$(GO) build -o bin/dam ./cmd/dam

.PHONY: deps
deps: $(INTEROP)/node_modules/.package-lock.json ## Download Go modules and install test tools (kcat, tmux, kafkajs) when missing
	$(GO) mod download
	@command -v kcat >/dev/null 2>&1 || ./scripts/install-kcat.sh
	@command -v tmux >/dev/null 2>&1 || ./scripts/install-tmux.sh

# kafkajs for the interop test (tests/interop), exactly as its
# package-lock.json pins it; reinstalled when the pin changes.
$(INTEROP)/node_modules/.package-lock.json: $(INTEROP)/package.json $(INTEROP)/package-lock.json
	cd $(INTEROP) && $(NPM) ci --no-audit --no-fund
	@touch $@

# Redocly CLI for make lint, exactly as its package-lock.json pins it.
$(APILINT)/node_modules/.package-lock.json: $(APILINT)/package.json $(APILINT)/package-lock.json
	cd $(APILINT) && $(NPM) ci --no-audit --no-fund
	@touch $@

.PHONY: test
test: deps chart rules ## Run every test with -race (starts a throwaway PostgreSQL when none is reachable), lint and render the chart, test the alert rules
	$(GO) vet ./...
	$(GO) vet -tags $(TEST_TAGS) ./...
	HELM=$(CURDIR)/$(HELM) $(GO) test -tags $(TEST_TAGS) -race -count=1 -timeout $(TEST_TIMEOUT) ./...

.PHONY: test-citus
test-citus: deps ## Run the database tests with -race on a throwaway Citus cluster (distributed PostgreSQL; installs Citus when missing)
	./scripts/install-citus.sh
	DAM_TEST_CITUS=1 $(GO) test -tags $(TEST_TAGS) -race -count=1 -timeout $(CITUS_TEST_TIMEOUT) $(CITUS_TEST_PKGS)

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

# Built into a directory of its own, then renamed: an interrupted build
# leaves no binary that looks finished.
$(GORELEASER):
	@mkdir -p bin
	GOBIN=$(CURDIR)/bin/.goreleaser-build CGO_ENABLED=0 $(GO) install -trimpath -ldflags "-s -w" \
	  github.com/goreleaser/goreleaser/v2@$(GORELEASER_VERSION)
	mv bin/.goreleaser-build/goreleaser $@ && rmdir bin/.goreleaser-build

# syft goes in a directory of its own: goreleaser runs it as `syft` from PATH.
$(SYFT):
	@mkdir -p bin
	GOBIN=$(CURDIR)/bin/.syft-build CGO_ENABLED=0 $(GO) install -trimpath -ldflags "-s -w -X main.version=$(SYFT_VERSION)" \
	  github.com/anchore/syft/cmd/syft@$(SYFT_VERSION)
	@mkdir -p $(dir $@)
	mv bin/.syft-build/syft $@ && rmdir bin/.syft-build

.PHONY: release-tools
release-tools: $(GORELEASER) $(SYFT) ## Build the pinned goreleaser and syft into bin/ (once, several minutes)

# goreleaser reads the commit with git and stamps "none" when the checkout
# has no remote (a local worktree): give it this directory as origin then.
GIT_ORIGIN_ENV = $$(git ls-remote --get-url >/dev/null 2>&1 || echo GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=remote.origin.url GIT_CONFIG_VALUE_0=$(CURDIR))

.PHONY: release-snapshot
release-snapshot: $(GORELEASER) $(SYFT) ## Build the release (archives, checksums, SBOMs) into dist/ without publishing, and check it
	env $(GIT_ORIGIN_ENV) PATH="$(CURDIR)/$(dir $(SYFT)):$$PATH" $(GORELEASER) release --snapshot --clean --skip=docker
	$(GO) run ./internal/cmd/releasecheck -dist dist

.PHONY: release-notes
release-notes: ## Print CHANGELOG.md's section of VERSION (default: the latest tag), the notes of its release
	@v="$${VERSION:-$$(git describe --tags --abbrev=0 2>/dev/null)}"; v="$${v#v}"; \
	if [ -z "$$v" ]; then echo "release-notes: no tag: set VERSION" >&2; exit 1; fi; \
	notes=$$(awk -v v="$$v" '/^## \[/ { on = index($$0, "## [" v "]") == 1; next } /^\[.*\]: / { next } on' CHANGELOG.md); \
	if [ -z "$${notes//[[:space:]]/}" ]; then echo "release-notes: CHANGELOG.md has no section [$$v]" >&2; exit 1; fi; \
	printf '%s\n' "$$notes"

.PHONY: promtool
promtool: ## Install promtool and prometheus (Debian's prometheus package) when missing
	@command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || ./scripts/install-prometheus.sh

.PHONY: rules
rules: promtool ## Check the alert rules and run their promtool tests
	promtool check rules $(CHART)/alerts/dam.rules.yaml
	promtool test rules $(CHART)/alerts/dam.rules.test.yaml

.PHONY: bench
bench: ## Run the benchmarks and print ratios against same-run baselines (BASE=<rev>: the dam to compare with; PROFILE=1: CPU profiles in bench-profiles/)
	$(GO) run ./internal/cmd/benchreport

.PHONY: chaos
chaos: ## Run every chaos scenario at full size through the real binary (about 18 minutes) and print the table (also in chaos.txt)
	@rm -f chaos.txt; status=0; \
	DAM_TEST_CHAOS=full DAM_TEST_CHAOS_TABLE=$(CURDIR)/chaos.txt $(GO) test -tags $(TEST_TAGS) -count=1 -timeout 80m -run '^TestChaos$$' ./tests/e2e || status=$$?; \
	if [ -f chaos.txt ]; then cat chaos.txt; else echo "chaos: no table written"; fi; exit $$status

.PHONY: lint
lint: $(GORELEASER) $(APILINT)/node_modules/.package-lock.json ## gofmt, go vet and staticcheck (pinned), goreleaser check, the OpenAPI document (Redocly CLI), the generated client current
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags $(TEST_TAGS) ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) -tags $(TEST_TAGS) ./cmd/dam
	$(GORELEASER) check
	$(REDOCLY) lint --config $(APILINT)/redocly.yaml --format=stylish serve/openapi.yaml
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	  (cd $(SERVECLIENT) && $(OAPI_CODEGEN) -config oapi-codegen.yaml -o $$tmp/client.gen.go ../../serve/openapi.yaml) && \
	  if ! cmp -s $$tmp/client.gen.go $(SERVECLIENT)/client.gen.go; then \
	    echo "$(SERVECLIENT)/client.gen.go is not what serve/openapi.yaml generates: run make generate"; exit 1; fi

.PHONY: generate
generate: ## Generate the check service's Go client (examples/serveclient) from serve/openapi.yaml
	cd $(SERVECLIENT) && $(OAPI_CODEGEN) -config oapi-codegen.yaml -o client.gen.go ../../serve/openapi.yaml

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
