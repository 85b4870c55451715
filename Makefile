# gang-extender developer commands. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help install lock audit kube helm manifests lint typecheck unit docs docs-reference test cluster-test soak soak-ci demo demo-down bench bench-plots bench-e2e bench-deepline bench-compare cluster-up cluster-down clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# The dependencies are pinned, with hashes, in requirements-dev.lock (runtime
# and dev tools; make install, CI) and requirements.lock (runtime only; the
# Dockerfile). Both come from pyproject.toml through `make lock`; an upgrade
# is `make lock UPGRADE=1`, reviewed and committed like any change.
LOCK := requirements.lock
DEV_LOCK := requirements-dev.lock
PIP_COMPILE = $(BIN)/pip-compile --quiet --strip-extras --generate-hashes --no-emit-find-links \
	--no-emit-index-url --allow-unsafe $(if $(UPGRADE),--upgrade)

$(STAMP): pyproject.toml $(DEV_LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --require-hashes -r $(DEV_LOCK)
	$(BIN)/pip install -q --no-deps -e .
	touch $@

install: $(STAMP) ## create .venv with the package and its dev tools, as pinned in requirements-dev.lock

lock: $(STAMP) ## re-pin the dependencies from pyproject.toml (keeps existing pins; UPGRADE=1 upgrades)
	$(PIP_COMPILE) --extra dev --output-file $(DEV_LOCK) pyproject.toml
	$(PIP_COMPILE) --constraint $(DEV_LOCK) --output-file $(LOCK) pyproject.toml
	$(BIN)/pip install -q --require-hashes -r $(DEV_LOCK)

# Vulnerabilities of the pinned versions, from PyPI's advisory data. A package
# the service cannot look up is reported and skipped; AUDIT_STRICT=1 fails on it.
audit: $(STAMP) ## pip-audit of requirements-dev.lock (the runtime lock is a subset of it)
	$(BIN)/pip-audit --progress-spinner off --disable-pip --require-hashes \
		--requirement $(DEV_LOCK) $(if $(AUDIT_STRICT),--strict)

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
	$(BIN)/ruff check app tests bench hack/local_cluster hack/local-cluster hack/demo.py hack/clusterkit.py hack/gen_reference.py
	$(BIN)/ruff format --check app tests bench hack/local_cluster hack/local-cluster hack/demo.py hack/clusterkit.py hack/gen_reference.py

typecheck: $(STAMP) ## mypy --strict
	$(BIN)/mypy

unit: $(STAMP) ## unit tests only (no cluster)
	$(BIN)/pytest tests/unit -q

# The manual (docs/, mkdocs.yml). --strict with mkdocs.yml's validation: a broken
# link or anchor, a missing page or one left out of the nav fails the build. No
# network is needed. The reference pages are generated from the code: a stale one
# fails here before mkdocs runs (and in tests/unit/test_reference_docs.py).
# Not --quiet: it hides the warnings from the count that --strict fails on.
DOCS_SITE ?= site
docs: $(STAMP) ## build the manual with mkdocs build --strict into DOCS_SITE (site/); fails on a broken link or a stale reference page
	$(BIN)/python hack/gen_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(DOCS_SITE)

docs-reference: $(STAMP) ## regenerate docs/reference/ (flags, Helm values, metrics, Events and messages), docs/index.md and docs/contributing.md
	$(BIN)/python hack/gen_reference.py

test: lint typecheck audit docs kube helm ## everything: lint, types, dependency audit, the manual's strict build, unit tests and tests against the real control plane
	$(BIN)/pytest tests -q -ra
	GANG_EXTENDER_TEST_MODE=every-verb $(BIN)/pytest tests/cluster -q -ra

cluster-test: $(STAMP) kube ## only the tests against the real control plane, in gang-only then every-verb mode
	$(BIN)/pytest tests/cluster -q -ra
	GANG_EXTENDER_TEST_MODE=every-verb $(BIN)/pytest tests/cluster -q -ra

soak: $(STAMP) kube ## the soak (issue 49) against the real control plane; e.g. SOAK_ARGS="--minutes 30 --seed 3 --burners 2" (python -m tests.soak --help)
	$(BIN)/python -m tests.soak $(SOAK_ARGS)

soak-ci: $(STAMP) kube ## the soak's short version alone (part of make test): fixed seeds, a minute each (tests/cluster/test_soak.py)
	$(BIN)/pytest tests/cluster/test_soak.py -q -ra

demo: $(STAMP) kube ## run the main job: local control plane + extender + example gangs
	$(BIN)/python hack/demo.py

demo-down: ## stop what `make demo` left running
	-$(BIN)/python hack/demo.py --stop
	hack/local-cluster down

cluster-up: kube ## start the local control plane only
	hack/local-cluster up

cluster-down: ## stop the local control plane
	hack/local-cluster down

# Each benchmark writes its figures to bench/results/ (committed with BENCHMARKS.md's
# figures); bench/plots.py draws docs/benchmarks/img/ from them (docs/benchmarks/index.md).
RESULTS := bench/results
LINE_SWEEP ?= 0,100,1000,10000
bench: $(STAMP) kube ## measure the speed targets: verbs in process (and a fresh gang's admission against the line's length), 40 gangs under contention, topology against kube-scheduler's own, the pod watch's cost, one verb call's cost on both sides (at 500 and 5,000 nodes), then end to end with kube-scheduler; JSON in bench/results, plots redrawn (updates BENCHMARKS.md's e2e section)
	$(BIN)/python bench/run.py --json $(RESULTS)/run.json
	$(BIN)/python bench/run.py --line-sweep $(LINE_SWEEP) --json $(RESULTS)/line.json
	$(BIN)/python bench/run.py --line-sweep $(LINE_SWEEP) --line-blocked --json $(RESULTS)/line-blocked.json
	$(BIN)/python -m bench.contention --json $(RESULTS)/contention.json
	$(BIN)/python -m bench.topology --json $(RESULTS)/topology.json
	$(BIN)/python -m bench.watchcost --json $(RESULTS)/watchcost.json
	$(BIN)/python -m bench.verbcost --json $(RESULTS)/verbcost-500.json
	$(BIN)/python -m bench.verbcost --nodes 5000 --json $(RESULTS)/verbcost-5000.json
	$(BIN)/python bench/e2e.py --write --json $(RESULTS)/e2e.json $(E2E_ARGS)
	$(BIN)/python bench/plots.py

bench-plots: $(STAMP) ## redraw docs/benchmarks/img/ from the JSON in bench/results (runs no benchmark)
	$(BIN)/python bench/plots.py

bench-e2e: $(STAMP) kube ## only the end-to-end benchmark; e.g. E2E_ARGS="--nodes 200 --pods 1000 --scale-nodes 0 --cache-pods 0"
	$(BIN)/python bench/e2e.py $(E2E_ARGS)

bench-deepline: $(STAMP) kube ## small gangs beside 1,000 big aged gangs with kube-scheduler (issue 46): gang-extender and the in-tree GangScheduling plugin, then the big gangs' start order; e.g. DEEPLINE_ARGS="--nodes 40 --big-gangs 200 --small-gangs 20"
	$(BIN)/python -m bench.deepline $(DEEPLINE_ARGS)

# Old main next to this checkout in one run, the two taking turns (bench/compare.py);
# e.g. ARGS="--nodes 1000 --pods 10000 --rounds 5", ARGS="--e2e" after `make kube`.
BASE ?= 985d682
ARGS ?=
bench-compare: $(STAMP) ## verbs in process (and with ARGS=--e2e end to end) of BASE and this checkout side by side, new/old per figure (--write: BENCHMARKS.md)
	$(BIN)/python bench/compare.py --base $(BASE) $(ARGS)

clean: ## remove the venv and the local cluster state (keeps the Go binary cache)
	-hack/local-cluster down
	rm -rf $(VENV) .local-cluster .local-cluster-bench .local-cluster-bench-topology site
