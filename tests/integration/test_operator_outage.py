"""API server outages longer than kopf's own request retries.

kopf retries a failed API request with backoffs that add up to under a minute,
then gives up on it. A longer outage killed its peering keep-alive, kopf's
reactor stopped, and its stop hung: the process ran on with no watchers and a
refused /healthz, and no policy was reconciled again. Now the operator retries
for ``METAINFER_API_RETRY_SECONDS`` (ten minutes by default) and, if the
reactor dies anyway, exits with status 1 so that its Deployment restarts it.

The outage is a proxy between this operator and the shared test API server
(taken down: connections refused, open streams cut), so other tests go on.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_harness import Nodes, apply_policy, jobs, make_policy, operator_process, wait_for
from outage_proxy import OutageProxy

from hack.controlplane.processes import free_port
from metainfer.agent.zoo import build_examples

# Longer than kopf's retries (1+1+2+3+5+8+13+21 = 54 s) and than its keep-alive period (<= 60 s), so the
# keep-alive is certain to hit the outage and to exhaust kopf's own backoffs within it.
OUTAGE_S = 130.0


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture
def proxy(control_plane: Any, tmp_path: Path) -> Iterator[tuple[OutageProxy, Path]]:
    """A proxy to the API server, and a kubeconfig through it."""
    proxy = OutageProxy(control_plane.server)
    proxy.up()
    kubeconfig = tmp_path / "via-proxy.kubeconfig"
    kubeconfig.write_text(proxy.kubeconfig(control_plane.kubeconfig.read_text()))
    try:
        yield proxy, kubeconfig
    finally:
        proxy.down()


@pytest.fixture
def policy_with_a_job(control_plane: Any, namespace: str, nodes: Nodes, tmp_path: Path) -> None:
    built = build_examples(tmp_path / "models", ["digits"])["digits"]
    nodes.add(("AVX2",))
    apply_policy(control_plane.api_client, make_policy(namespace, "digits", built.model_path, built.sha256))


@pytest.mark.usefixtures("policy_with_a_job")
def test_operator_rides_out_an_api_server_outage_longer_than_kopfs_retries(
    control_plane: Any, namespace: str, nodes: Nodes, proxy: tuple[OutageProxy, Path], tmp_path: Path
) -> None:
    api, (outage, kubeconfig) = control_plane.api_client, proxy
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    with operator_process(kubeconfig, namespace, tmp_path, liveness=liveness) as op:
        wait_for("the first Job", lambda: len(jobs(api, namespace)) == 1, timeout=90)
        wait_for("/healthz", lambda: healthy(liveness), timeout=30)
        outage.down()
        time.sleep(OUTAGE_S)
        outage.up()
        nodes.add(("AVX2", "AVX512VNNI"))  # a change made after the outage must still be acted on
        try:
            wait_for("a Job for the class added after the outage", lambda: len(jobs(api, namespace)) == 2,
                     timeout=120)  # fmt: skip
            wait_for("/healthz after the outage", lambda: healthy(liveness), timeout=30)
        except AssertionError as exc:
            alive = op.proc is not None and op.proc.poll() is None
            raise AssertionError(f"{exc}; operator alive={alive}\n{op.output()[-8000:]}") from exc
        assert op.proc is not None and op.proc.poll() is None, "the operator exited although it could recover"
        assert "Multidimensional multitasker has failed" not in op.output()


@pytest.mark.usefixtures("policy_with_a_job")
def test_operator_exits_to_be_restarted_when_the_outage_outlasts_its_retries(
    control_plane: Any, namespace: str, proxy: tuple[OutageProxy, Path], tmp_path: Path
) -> None:
    api, (outage, kubeconfig) = control_plane.api_client, proxy
    budget = {"METAINFER_API_RETRY_SECONDS": "5"}
    with operator_process(kubeconfig, namespace, tmp_path, liveness="", env=budget) as op:
        wait_for("the first Job", lambda: len(jobs(api, namespace)) == 1, timeout=90)
        outage.down()
        assert op.proc is not None
        try:
            code = op.proc.wait(timeout=OUTAGE_S)
        except Exception as exc:
            raise AssertionError(f"the operator did not exit: {exc}\n{op.output()[-8000:]}") from exc
        assert code == 1, op.output()[-4000:]
        assert "exiting to be restarted" in op.output()
