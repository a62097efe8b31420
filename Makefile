# idempotent-events — run `make help` for the targets.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help

GO        ?= go
BIN       ?= bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/idempotent-events/idempotent-events/pkg/internal/telemetry.Version=$(VERSION)
GOFLAGS_BUILD := -trimpath -buildvcs=false

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build receiver, worker, migrate and eventsctl into bin/ (static, as in the image)
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

.PHONY: services
services: ## Make RabbitMQ, Redis and PostgreSQL listen on 127.0.0.1: use, start, install (Debian/Ubuntu as root) or compose.yaml, whichever fits (hack/services.sh)
	hack/services.sh

.PHONY: services-down
services-down: ## Stop what `make services` started, nothing else (their data and logs stay in its state directory)
	hack/services.sh down

.PHONY: dev
dev: services build ## Migrate, then run receiver + worker in the foreground against local services (Ctrl-C stops both; WORKER=./examples/orders runs your own worker)
	BIN=$(BIN) WORKER=$(WORKER) hack/dev.sh

.PHONY: test
test: ## The whole suite, stage by stage with a table of their times (hack/test.sh): services, packages, Go tests on the real services, lint, short fuzz and chaos runs, alert/dashboard checks, chart/image/dev-loop checks, the chart on a real one-node Kubernetes
	hack/test.sh

.PHONY: deps
deps: browser ## Debian packages the suite needs: Chromium (browser), and the one-node cluster's (containerd, runc, docker.io, debootstrap, ...; needs root)
	hack/k8s/deps.sh

.PHONY: tools
tools: ## Build every pinned tool (Kubernetes, KEDA, Helm, CoreDNS, promtool, golangci-lint, ...) into the shared tools cache (hack/tools/build.sh)
	hack/tools/build.sh all

.PHONY: browser
browser: ## Install Debian's headless Chromium for the DLQ page's browser test (needs root + apt; in CI a failure is fatal)
	@hack/install-browser.sh || { if [ -n "$${CI:-}" ]; then exit 1; fi; echo "browser: not installed; the browser test will try again and skip if it cannot"; }

.PHONY: fresh-machine
fresh-machine: ## compose.yaml checked offline, then `make dev` on a fresh Debian root without the services, until the README's first example works (root; hack/fresh-machine/test.sh)
	cd hack/fresh-machine/compose && $(GO) test -count=1 ./...
	hack/fresh-machine/test.sh

.PHONY: lint
lint: ## gofmt and golangci-lint (.golangci.yaml; pinned, built into bin/ on first use)
	hack/lint.sh

.PHONY: stripe-mock
stripe-mock: ## Build Stripe's stripe-mock into bin/ (pinned; the reconciler's contract test lists events against it)
	hack/stripe-mock.sh

.PHONY: check
check: services lint stripe-mock ## The edit loop: lint, then the Go tests without the slow suites (-short: no binaries built, no browser; Go's test cache reuses the results of unchanged packages)
	$(GO) test -short ./...

.PHONY: test-go
test-go: stripe-mock ## Go tests (unit + integration against 127.0.0.1 services), race detector on
	$(GO) test -race -count=1 -timeout 30m ./...

.PHONY: fuzz-short
fuzz-short: ## Every fuzz target (signature parsers, event decoders) for a fixed number of executions (no wall-clock budget)
	hack/fuzz.sh short

.PHONY: fuzz
fuzz: ## Every fuzz target for 3 minutes; fails only on a failing input written to testdata/fuzz
	hack/fuzz.sh 3m

.PHONY: chaos-short
chaos-short: ## Every chaos scenario, small: 500 payments of 3 events x 4 deliveries each, 10 s Postgres outage (about 4.5 minutes); then pg-failover: 2,000 payments of 3 events, each delivered once, through 3 failovers of a private synchronous Postgres (about 1 minute)
	$(GO) run ./pkg/internal/cmd/chaos -events 500 -dups 3 -duration 8s -pg-outage 10s
	$(GO) run ./pkg/internal/cmd/chaos -scenarios pg-failover -events 2000 -dups 0 -duration 16s -pg-failovers 3 -pg-failover-every 4s

.PHONY: chaos
chaos: services ## The long chaos run: 50,000 payments of 3 events x 4 deliveries per scenario, 60 s Postgres outage, real FLUSHALL; then pg-failover: 20,000 payments of 3 events, each delivered once (a redelivery would repair a lost row), through 5 failovers of a private synchronous Postgres
	$(GO) run ./pkg/internal/cmd/chaos -events 50000 -dups 3 -duration 60s -pg-outage 60s -flushall
	$(GO) run ./pkg/internal/cmd/chaos -scenarios pg-failover -events 20000 -dups 0 -duration 60s -pg-failovers 5 -pg-failover-every 10s

.PHONY: bench
# The worker's drain rate is compared, in the same run, with the worker of
# BENCH_BASELINE: the last revision before the effects API (one-statement
# commits with the payments row).
BENCH_BASELINE ?= 5bb25a2

bench: services ## Benchmark harness: receiver, worker, end-to-end and memory beside this machine's raw limits, and the worker beside BENCH_BASELINE's (medians of 3 runs)
	$(GO) run ./pkg/internal/cmd/bench -runs 3 -baseline $(BENCH_BASELINE)

.PHONY: check-observability
check-observability: ## promtool check/test of the alert rules, dashboard validation, runbook coverage
	hack/check-observability.sh

.PHONY: k8s-e2e
k8s-e2e: services ## The chart on a real one-node Kubernetes built here, nine scenarios, torn down after (root; the first run builds Kubernetes, KEDA, helm and CoreDNS from the module proxy)
	hack/k8s/e2e.sh

.PHONY: k8s-down
k8s-down: ## Stop a cluster left by `KEEP=1 hack/k8s/e2e.sh` (or by a killed run)
	hack/k8s/e2e.sh --down

.PHONY: check-deploy
check-deploy: ## Offline checks of the Helm chart, Dockerfile, kind config and Tiltfile
	hack/check-deploy.sh
