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
# image holds exactly what a `pip install metainfer` would, at the lock's versions.

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
COPY locks/ /dist/locks/

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
# A venv keeps the image's Python untouched; the wheel and the locks come from the builder through a bind mount,
# so they are not left in a layer. The dependencies come from the lock alone (--no-deps on the wheel: pip resolves
# nothing at build time). Bytecode is compiled at install time: the root filesystem is read-only at runtime.
RUN --mount=type=bind,from=builder,source=/dist,target=/dist \
    set -eux; \
    python3 -m venv "$VIRTUAL_ENV"; \
    pip install --require-hashes --no-deps --only-binary=:all: -r "/dist/locks/${RUNTIME}.txt"; \
    pip install --no-deps /dist/metainfer-*.whl; \
    python -c "import onnxruntime, metainfer.agent.cli; print('providers:', onnxruntime.get_available_providers())"; \
    mkdir -p /var/cache/metainfer; \
    chown 65532:65532 /var/cache/metainfer

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
