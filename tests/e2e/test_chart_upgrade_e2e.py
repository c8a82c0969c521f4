"""Upgrading the chart in place while a policy serves, as a platform team upgrades a release.

The previous release (chart 0.1.0, its CRDs in Helm's crds/ folder) is installed from the cluster's registry, a
digits policy is adapted and served, then docs/helm.md's adoption (command for command) and `helm upgrade` to
this checkout's chart, read from the same registry, run while a client sends a request every 50 ms through the
policy's Service. The policy must not notice: no failed request, no gap, no new run, its serving pods untouched.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from platform_harness import (
    CONTINUITY_GAP_S,
    DIGITS_POLICY,
    RELEASE_NAMESPACE,
    WORKLOAD_NAMESPACE,
    Platform,
    digits_client_loop,
    digits_policy,
    model_ready_at,
    ready_serving_pods,
    reporter,
    require_root,
    running_platform,
)

from hack import helm as hack_helm
from metainfer.agent.zoo import build_examples
from metainfer.core.api import names

SERVING = f"{names.COMPONENT}=serving,{names.LABEL_POLICY}={DIGITS_POLICY}"


@pytest.fixture(scope="module")
def previous_release(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    require_root()
    chart = hack_helm.previous_chart(tmp_path_factory.mktemp("previous-chart"))
    root = tmp_path_factory.mktemp("upgrade-cluster")
    with running_platform(root, reporter(request), first_chart=chart) as handle:
        yield handle


def _release(platform: Platform) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        platform.helm("get", "metadata", "metainfer", "-n", RELEASE_NAMESPACE, "-o", "json").stdout
    )
    return found


def _ours(platform: Platform) -> list[dict[str, Any]]:
    crds: list[dict[str, Any]] = platform.get("crds")["items"]
    return [c for c in crds if c["spec"]["group"] in (names.GROUP, "kopf.dev")]


def _run_names(platform: Platform) -> list[str]:
    return sorted(r["metadata"]["name"] for r in platform.get("adaptationruns", "-n", WORKLOAD_NAMESPACE)["items"])


def test_upgrading_from_the_previous_chart_costs_a_serving_policy_no_request(
    previous_release: Platform, tmp_path: Path
) -> None:
    platform = previous_release
    assert _release(platform)["version"] == hack_helm.PREVIOUS_CHART_VERSION
    assert all("meta.helm.sh/release-name" not in (c["metadata"].get("annotations") or {}) for c in _ours(platform))

    model = build_examples(tmp_path, ["digits"])["digits"].model_path
    platform.kubectl(
        "create", "configmap", "digits-model", "-n", WORKLOAD_NAMESPACE, f"--from-file=model.onnx={model}"
    )  # fmt: skip
    policy = digits_policy(hashlib.sha256(model.read_bytes()).hexdigest())
    platform.kubectl("apply", "-f", "-", stdin=json.dumps(policy))
    served = platform.wait(
        "a Ready serving pod under the previous chart", lambda: ready_serving_pods(platform, SERVING), 600, 2
    )
    # The first pod's Ready reaches kube-proxy's rules a moment later (CI saw 16 refused connections in the first
    # 0.8 s): the client starts once the policy's address routes, as one following status.endpoint would.
    cluster_ip = platform.get("service", DIGITS_POLICY, "-n", WORKLOAD_NAMESPACE)["spec"]["clusterIP"]
    platform.wait("the policy's Service to route", lambda: model_ready_at(cluster_ip, DIGITS_POLICY), 30, 0.5)
    pods_before = sorted(p["metadata"]["uid"] for p in served)
    runs_before = _run_names(platform)
    (operator_before,) = platform.get("pods", "-n", RELEASE_NAMESPACE, "-l", f"{names.COMPONENT}=operator")["items"]

    with digits_client_loop(platform) as loop:
        started = time.monotonic()
        # docs/helm.md#upgrading-from-chart-010: hand the CRDs to the release, then upgrade.
        for crd in _ours(platform):
            name = crd["metadata"]["name"]
            platform.kubectl("label", "crd", name, "app.kubernetes.io/managed-by=Helm", "--overwrite")
            platform.kubectl("annotate", "crd", name, "meta.helm.sh/release-name=metainfer",
                             f"meta.helm.sh/release-namespace={RELEASE_NAMESPACE}", "--overwrite")  # fmt: skip
        platform.helm(
            "upgrade", "metainfer", *platform.chart_args(), "-n", RELEASE_NAMESPACE, "--reset-then-reuse-values",
            "--wait", "--timeout", "4m",
        )  # fmt: skip
        platform.timings["chart_upgrade_s"] = time.monotonic() - started
        # The new operator has resynced every policy (resyncSeconds 10) before the client stops.
        time.sleep(25)
    report = loop.report
    platform.log(f"continuity, chart upgrade from {hack_helm.PREVIOUS_CHART_VERSION}: {report.describe()}")
    assert report.sent > 0 and report.failed == 0, report.describe()
    assert report.longest_gap_s <= CONTINUITY_GAP_S, report.describe()

    assert _release(platform)["version"] == platform.published.chart_version
    (operator_after,) = platform.get("pods", "-n", RELEASE_NAMESPACE, "-l", f"{names.COMPONENT}=operator")["items"]
    assert operator_after["metadata"]["uid"] != operator_before["metadata"]["uid"], "the operator was not rolled"
    for crd in _ours(platform):
        annotations = crd["metadata"].get("annotations") or {}
        assert annotations.get("meta.helm.sh/release-name") == "metainfer", crd["metadata"]["name"]
        assert annotations.get("helm.sh/resource-policy") == "keep", crd["metadata"]["name"]
    # Nothing the policy had was redone: same runs, the same serving pods, still Ready.
    assert _run_names(platform) == runs_before
    assert sorted(p["metadata"]["uid"] for p in ready_serving_pods(platform, SERVING)) == pods_before
    policy = platform.get("adaptationpolicy", DIGITS_POLICY, "-n", WORKLOAD_NAMESPACE)
    ready = next(c for c in policy["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", policy["status"]["conditions"]
