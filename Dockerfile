# syntax=docker/dockerfile:1
# One image for the operator, the adaptation Jobs and the serving pods; entrypoint `metainfer`.
#
#   docker build -t metainfer:0.1.0 .
#   docker build -t metainfer:0.1.0-cuda --build-arg RUNTIME=cuda .
#
# RUNTIME names a lock under locks/ (`make lock` writes them from pyproject.toml): cpu (onnxruntime, the default),
# cuda (onnxruntime-gpu with CUDA and cuDNN wheels), openvino (onnxruntime-openvino). Every package is pinned by
# version and sha256, so two builds of one commit install byte-identical wheels.
# The runtime stage installs the wheel built by the builder stage, never the checkout, so the
# image holds exactly what a `pip install metainfer` would, at the lock's versions: the base image's layers,
# one layer of dependencies (changes with the lock) and one of the project (changes with every commit).

ARG PYTHON_VERSION=3.11
ARG BASE_IMAGE=python:${PYTHON_VERSION}-slim-bookworm

FROM python:${PYTHON_VERSION}-slim-bookworm AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core/ core/
COPY agent/ agent/
COPY operator/ operator/
RUN python -m pip wheel --no-deps --wheel-dir /dist .

FROM ${BASE_IMAGE} AS runtime
ARG RUNTIME=cpu
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/metainfer \
    PATH=/opt/metainfer/bin:$PATH
# Two layers, so that a new version of the project changes only the small one: a registry that holds the
# previous version receives, and a node that ran it pulls, a few MiB instead of the dependencies again.
# First the dependencies, from the lock alone (pip resolves nothing at build time), in a venv that keeps the
# image's Python untouched; the lock comes through a bind mount from the build context, so it is not left in a
# layer and only a lock change rebuilds this one. Bytecode is compiled at install time: the root filesystem is
# read-only at runtime.
RUN --mount=type=bind,source=locks,target=/locks \
    set -eux; \
    python3 -m venv "$VIRTUAL_ENV"; \
    pip install --require-hashes --no-deps --only-binary=:all: -r "/locks/${RUNTIME}.txt"; \
    mkdir -p /var/cache/metainfer; \
    chown 65532:65532 /var/cache/metainfer
# ONNX Runtime's own telemetry off for every process of the image, also one that never imports metainfer (which
# switches it off itself: metainfer/core/runtime_telemetry.py). Left on, it uploads usage events from each pod.
ENV ORT_DISABLE_TELEMETRY=1
# Then the project: the wheel built by the builder stage (--no-deps: everything it needs is in the layer below).
# The import check runs with an empty HOME and TMPDIR and fails if anything is left there: a runtime's telemetry
# leaves its ids and event caches (ONNX Runtime's device id, OpenVINO's client id), which no image should carry.
RUN --mount=type=bind,from=builder,source=/dist,target=/dist \
    set -eux; \
    pip install --no-deps /dist/metainfer-*.whl; \
    check="$(mktemp -d)"; \
    HOME="$check" TMPDIR="$check" python -c "import onnxruntime, metainfer.agent.cli; print('providers:', onnxruntime.get_available_providers())"; \
    test -z "$(ls -A "$check")"; \
    rm -rf "$check"

# Read-only root filesystem: HOME, matplotlib's config and caches live on writable mounts
# (/tmp and /var/cache/metainfer are emptyDirs in the chart's and the operator's pod specs).
ENV HOME=/tmp \
    XDG_CACHE_HOME=/var/cache/metainfer \
    MPLCONFIGDIR=/tmp/matplotlib
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080 8081 8000
ENTRYPOINT ["metainfer"]
CMD ["--help"]
