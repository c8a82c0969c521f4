#!/usr/bin/env python3
"""Provide the helm binary at a pinned version and print its path.

    PYTHONSAFEPATH=1 .venv/bin/python hack/helm.py          # prints the path, building helm if needed
    PYTHONSAFEPATH=1 .venv/bin/python hack/helm.py --version

Why build from source: no release tarball host is reachable here, but the Go
module proxy is, exactly as for the control plane (hack/controlplane/assets.py,
whose build step this reuses: temporary file renamed into place, so an
interrupted build never leaves a half-written binary; a file lock serialises
concurrent builders; module and build caches shared with the control plane).

The binary lands in ``~/.cache/metainfer/helm/<version>/helm`` (``METAINFER_CACHE``
moves the root) and is reused when present. ``METAINFER_HELM`` points at an
existing helm instead (e.g. one a CI image already has); it is used as is.

The chart's tests (tests/integration/test_chart_render.py, tests/integration/test_chart_on_cluster.py)
import ``provide`` and ``all_optional_on`` from ``hack.helm``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from hack.controlplane import assets
from hack.controlplane.errors import AssetError

REPO = Path(__file__).resolve().parents[1]
# Helm 4 is the current major line; v4.3.2 declares Go 1.26 in its go.mod, like Kubernetes v1.37.
HELM_VERSION = "v4.3.2"
HELM_MODULE = "helm.sh/helm/v4"

_VERSION_PKG = f"{HELM_MODULE}/internal/version"
HELM = assets.GoBinary(
    name="helm",
    module=HELM_MODULE,
    version=HELM_VERSION,
    package=f"{HELM_MODULE}/cmd/helm",
    ldflags=f"-s -w -X {_VERSION_PKG}.version={HELM_VERSION} -X {_VERSION_PKG}.gitTreeState=clean",
)


# The last commit whose chart (0.1.0) carried its CRDs in Helm's crds/ folder: what an upgrade starts from.
PREVIOUS_CHART_COMMIT = "68087a8002d8b730e024ad7d1ff4c934e8f73ef4"
PREVIOUS_CHART_VERSION = "0.1.0"


def previous_chart(out: Path) -> Path:
    """The previous release's chart directory, read from git history into ``out``."""
    archive = out / "chart.tar"
    result = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), PREVIOUS_CHART_COMMIT,
         "charts/metainfer"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise AssetError(f"the previous chart is read from git history ({PREVIOUS_CHART_COMMIT}): {result.stderr}")
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    chart = out / "charts" / "metainfer"
    if f"version: {PREVIOUS_CHART_VERSION}" not in (chart / "Chart.yaml").read_text():
        raise AssetError(f"{PREVIOUS_CHART_COMMIT} holds no chart {PREVIOUS_CHART_VERSION}")
    return chart


def all_optional_on() -> list[str]:
    """Flags for ``helm template``/``lint`` that switch on every optional feature of charts/metainfer.

    The monitors and the rule
    carry kube-prometheus-stack's selector label, scrape timeouts and relabelings; the operator pod and the pods it
    creates get a pull secret (``regcred``); the NetworkPolicies and the operator's PodDisruptionBudget are on.
    """
    relabel = '[{"action":"replace","sourceLabels":["__meta_kubernetes_pod_node_name"],"targetLabel":"node"}]'
    drop = '[{"action":"drop","sourceLabels":["__name__"],"regex":"python_gc_.*"}]'
    return [
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.podMonitor.enabled=true",
        "--set", "prometheusRule.enabled=true",
        "--set", "dashboard.enabled=true",
        "--set", "prometheus.url=http://prometheus.monitoring:9090",
        "--set-json", 'labelMapping={"cpuFeatures":["AVX2","AVX512VNNI"]}',
        *(arg for monitor in ("serviceMonitor", "podMonitor") for arg in (
            "--set", f"metrics.{monitor}.labels.release=kube-prometheus-stack",
            "--set", f"metrics.{monitor}.scrapeTimeout=10s",
            "--set-json", f"metrics.{monitor}.relabelings={relabel}",
            "--set-json", f"metrics.{monitor}.metricRelabelings={drop}",
        )),
        "--set", "prometheusRule.labels.release=kube-prometheus-stack",
        "--set-json", 'imagePullSecrets=[{"name":"regcred"}]',
        "--set-json", 'workloads.imagePullSecrets=[{"name":"regcred"}]',
        "--set", "networkPolicy.enabled=true",
        "--set", "operator.podDisruptionBudget.enabled=true",
        "--set", "networkPolicy.apiServer.cidrs={10.96.0.1/32}",
        "--set-json", 'networkPolicy.modelStore=[{"to":[{"ipBlock":{"cidr":"10.20.0.0/16"}}],"ports":[{"port":443}]}]',
    ]  # fmt: skip


def provide(log: assets.Log = print) -> Path:
    """Return the path of a usable helm: ``METAINFER_HELM``, the cache, or a fresh build into the cache."""
    return assets.provide_go_binary(HELM, "METAINFER_HELM", log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="store_true", help="also run `helm version` and print it")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        path = provide(lambda message: print(f"[helm] {message}", file=sys.stderr, flush=True))
    except AssetError as exc:
        print(f"[helm] error: {exc}", file=sys.stderr)
        return 1
    print(path)
    if args.version:
        shown = subprocess.run([str(path), "version", "--short"], capture_output=True, text=True, check=False)
        print(shown.stdout.strip() or shown.stderr.strip())
        print(f"({time.monotonic() - started:.0f}s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
