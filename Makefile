# gang-extender developer commands. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help install kube helm manifests lint typecheck unit test cluster-test demo demo-down bench cluster-up cluster-down clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(STAMP) ## create .venv with the package and its dev tools

kube: ## build (or reuse) etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
	hack/build-kube >/dev/null

helm: ## build (or reuse) helm at the version pinned in hack/kube/versions.env
	hack/build-helm >/dev/null

MANIFESTS ?= deploy/manifests/gang-extender.yaml
manifests: helm ## render the chart into deploy/manifests/gang-extender.yaml (kubectl apply without Helm)
	{ printf '%s\n' '# Generated from charts/gang-extender by `make manifests` (default values,' \
	    '# release gang-extender, namespace gang-extender). Do not edit: change the chart' \
	    '# and regenerate.' 'apiVersion: v1' 'kind: Namespace' 'metadata:' '  name: gang-extender'; \
	  "$$(hack/build-helm)/helm" template gang-extender charts/gang-extender \
	    --namespace gang-extender --include-crds; } > $(MANIFESTS).tmp
	mv $(MANIFESTS).tmp $(MANIFESTS)

lint: $(STAMP) ## ruff lint and format check
	$(BIN)/ruff check app tests bench hack/local_cluster.py hack/demo.py
	$(BIN)/ruff format --check app tests bench hack/local_cluster.py hack/demo.py

typecheck: $(STAMP) ## mypy --strict
	$(BIN)/mypy

unit: $(STAMP) ## unit tests only (no cluster)
	$(BIN)/pytest tests/unit -q

test: lint typecheck kube helm ## everything: lint, types, unit tests and tests against the real control plane
	$(BIN)/pytest tests -q -ra

cluster-test: $(STAMP) kube ## only the tests against the real control plane
	$(BIN)/pytest tests/cluster -q -ra

demo: $(STAMP) kube ## run the main job: local control plane + extender + example gangs
	$(BIN)/python hack/demo.py

demo-down: ## stop what `make demo` left running
	-$(BIN)/python hack/demo.py --stop
	hack/local-cluster down

cluster-up: kube ## start the local control plane only
	hack/local-cluster up

cluster-down: ## stop the local control plane
	hack/local-cluster down

bench: $(STAMP) kube ## measure the speed targets (writes figures to stdout; record them in BENCHMARKS.md)
	$(BIN)/python bench/run.py
	$(BIN)/python -m bench.contention

clean: ## remove the venv and the local cluster state (keeps the Go binary cache)
	-hack/local-cluster down
	rm -rf $(VENV) .local-cluster
