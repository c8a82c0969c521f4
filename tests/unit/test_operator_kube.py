"""How the operator's writes classify the API server's answers: done, retry, or refused for good."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kopf
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from metainfer.operator import kube

JOB = {"kind": "Job", "metadata": {"name": "run-a", "namespace": "ns"}, "spec": {}}


def _answer(monkeypatch: pytest.MonkeyPatch, status: int, message: str = "") -> None:
    def create(manifest: dict[str, Any]) -> None:
        exc = ApiException(status=status, reason="Reason")
        exc.body = json.dumps({"kind": "Status", "message": message})
        raise exc

    monkeypatch.setattr(kube, "_create", create)


def test_an_existing_child_is_success(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(monkeypatch, 409)
    assert asyncio.run(kube.create_if_absent(JOB)) is False


def test_an_overloaded_server_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(monkeypatch, 503)
    with pytest.raises(kopf.TemporaryError):
        asyncio.run(kube.create_if_absent(JOB))


@pytest.mark.parametrize("status", [400, 403, 422])
def test_a_refusal_no_retry_can_change_is_reported_with_the_servers_message(
    monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    # Retried every 5 s forever, it left a stale status and no event.
    _answer(monkeypatch, status, 'Job.batch "run-a" is invalid: spec.template.spec.tolerations[0].operator: ...')
    with pytest.raises(kube.ChildRejected) as err:
        asyncio.run(kube.create_if_absent(JOB))
    assert "create Job run-a" in str(err.value) and "tolerations[0].operator" in str(err.value)
    _answer(monkeypatch, status, "x" * 10_000)
    with pytest.raises(kube.ChildRejected) as err:
        asyncio.run(kube.create_if_absent(JOB))
    assert len(str(err.value)) <= 2048


def test_no_answer_at_all_is_a_retry_not_an_unexpected_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    # An API server outage used to surface as "failed unexpectedly" with a traceback per reconcile.
    def refused(manifest: dict[str, Any]) -> None:
        raise urllib3.exceptions.MaxRetryError(None, "/apis", ConnectionRefusedError(111, "Connection refused"))

    monkeypatch.setattr(kube, "_create", refused)
    with pytest.raises(kopf.TemporaryError, match="API server unreachable"):
        asyncio.run(kube.create_if_absent(JOB))


def test_api_retry_backoffs_spend_the_budget_and_restart_for_every_request() -> None:
    from metainfer.operator.startup import ApiRetryBackoffs

    backoffs = ApiRetryBackoffs(600)
    first = list(backoffs)
    assert first[:8] == [1, 1, 2, 3, 5, 8, 13, 21] and set(first[8:]) == {30}
    assert 570 < sum(first) <= 600
    assert list(backoffs) == first  # kopf iterates the setting afresh for every request
    assert list(ApiRetryBackoffs(0)) == []
    assert sum(ApiRetryBackoffs(5)) <= 5


def test_startup_releases_only_deleted_policies_of_terminating_watched_namespaces() -> None:
    from types import SimpleNamespace

    from metainfer.operator.namespaces import FINALIZER, terminating_watched, without_finalizer

    def ns(name: str, deleted: bool) -> SimpleNamespace:
        return SimpleNamespace(
            metadata=SimpleNamespace(name=name, deletion_timestamp="2026-11-30T00:00:00Z" if deleted else None)
        )

    found = [ns("team-a", True), ns("team-b", False), ns("other", True), ns("team-c", True)]
    assert terminating_watched(found, ["team-a", "team-b"]) == ["team-a"]
    assert terminating_watched(found, ["team-*, !team-c"]) == ["team-a"]  # kopf's own pattern syntax
    assert terminating_watched(found, []) == []

    deleted = {"metadata": {"deletionTimestamp": "t", "finalizers": ["other/keep", FINALIZER]}}
    assert without_finalizer(deleted) == [
        {"op": "test", "path": "/metadata/finalizers", "value": ["other/keep", FINALIZER]},
        {"op": "replace", "path": "/metadata/finalizers", "value": ["other/keep"]},
    ]
    assert without_finalizer({"metadata": {"finalizers": [FINALIZER]}}) is None  # not being deleted
    assert without_finalizer({"metadata": {"deletionTimestamp": "t", "finalizers": ["other/keep"]}}) is None


def test_a_bad_platform_setting_stops_the_operator_naming_the_variable(tmp_path: Path) -> None:
    """kopf retries a failing startup handler forever; a value no retry can fix must stop the process instead."""
    env = {
        **os.environ,
        "PYTHONSAFEPATH": "1",
        "KUBECONFIG": str(tmp_path / "none"),
        "METAINFER_JOB_RESOURCES": '{"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}',
    }
    proc = subprocess.run(
        [sys.executable, "-m", "metainfer.agent.cli", "operator", "--liveness", ""],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "METAINFER_JOB_RESOURCES: requests.cpu must not exceed limits.cpu" in proc.stderr
