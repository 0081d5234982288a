# llmq: `make test` is the one command developers and CI run.
#
#   make services  install/start/check PostgreSQL and RabbitMQ (scripts/services)
#   make test      tracked-file check, services, lint, vet, then go test -race (TESTFLAGS adds flags)
#   make check-tracked  fail if an executable or a file over 1 MiB is tracked
#   make lint      golangci-lint, pinned below, built into ./bin on first use
#   make vet       go vet
#   make demo      services, then the invoice pipeline end to end (go run ./examples/demo)
#   make console   services, the demo (its data in schema llmq_demo), then the operator
#                  web console on it at http://$(CONSOLE_ADDR)/ (CONSOLEFLAGS adds flags)
#   make chaos     services, then the production acceptance suite (CHAOSFLAGS adds flags)
#   make quickstart  services, then go run ./examples/quickstart
#   make bench     services, then all benchmarks (BENCHFLAGS adds flags)
#   make fmt       gofmt -w the repository's Go files

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

GO ?= go
TESTFLAGS ?=
BENCHFLAGS ?=
CHAOSFLAGS ?=
CONSOLEFLAGS ?=
CONSOLE_ADDR ?= 127.0.0.1:8080

GOLANGCI_LINT_VERSION := v2.15.0
BIN_DIR := $(CURDIR)/bin
GOLANGCI_LINT := $(BIN_DIR)/golangci-lint

DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
AMQP_URL ?= amqp://guest:guest@127.0.0.1:5672/
export DATABASE_URL AMQP_URL

.PHONY: all check-tracked services test lint golangci-lint vet demo console chaos quickstart bench fmt clean

all: test

services:
	./scripts/services

check-tracked:
	./scripts/check-tracked

# The prerequisites run in this order (check-tracked, services, lint, vet)
# and make stops at the first that fails.
test: check-tracked services lint vet
	$(GO) test -race -count=1 $(TESTFLAGS) ./...

lint: golangci-lint
	$(GOLANGCI_LINT) run ./...

# Builds golangci-lint from source through the Go module proxy, only when
# ./bin has none or one of another version.
golangci-lint:
	@if [ "$$("$(GOLANGCI_LINT)" version --short 2>/dev/null)" != "$(GOLANGCI_LINT_VERSION:v%=%)" ]; then \
		echo "installing golangci-lint $(GOLANGCI_LINT_VERSION) into $(BIN_DIR) (go install, takes a few minutes)"; \
		GOBIN="$(BIN_DIR)" $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION); \
	fi

vet:
	$(GO) vet ./...

demo: services
	$(GO) run ./examples/demo

# The demo leaves its jobs, attempts, events, pool and usage in schema
# llmq_demo; the console serves them read-only on loopback until Ctrl-C
# (CONSOLEFLAGS=-actions to try replays), opening a browser where one is.
console: services
	$(GO) run ./examples/demo -schema llmq_demo
	$(GO) build -o $(BIN_DIR)/llmq ./cmd/llmq
	@( sleep 2; command -v xdg-open >/dev/null 2>&1 && xdg-open "http://$(CONSOLE_ADDR)/" >/dev/null 2>&1 || true ) &
	$(BIN_DIR)/llmq console -schema llmq_demo -addr $(CONSOLE_ADDR) $(CONSOLEFLAGS)

# The faults, the load and the invariants of examples/chaos (doc.go); a
# few minutes by default, -duration/-rate/-workers/-broker/-seed to change.
chaos: services
	$(GO) run ./examples/chaos $(CHAOSFLAGS)

quickstart: services
	$(GO) run ./examples/quickstart

bench: services
	$(GO) test -run '^$$' -bench . -benchmem $(BENCHFLAGS) ./...

fmt:
	git ls-files -z --cached --others --exclude-standard -- '*.go' | xargs -0 -r gofmt -w

clean:
	rm -rf $(BIN_DIR)
