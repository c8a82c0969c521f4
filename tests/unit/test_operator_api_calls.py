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

from metainfer.operator import api_calls

JOB = {"kind": "Job", "metadata": {"name": "run-a", "namespace": "ns"}, "spec": {}}


def _answer(monkeypatch: pytest.MonkeyPatch, status: int, message: str = "") -> None:
    def create(manifest: dict[str, Any]) -> None:
        exc = ApiException(status=status, reason="Reason")
        exc.body = json.dumps({"kind": "Status", "message": message})
        raise exc

    monkeypatch.setattr(api_calls, "_create", create)


def test_an_existing_child_is_success(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(monkeypatch, 409)
    assert asyncio.run(api_calls.create_if_absent(JOB)) is False


def test_an_overloaded_server_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(monkeypatch, 503)
    with pytest.raises(kopf.TemporaryError):
        asyncio.run(api_calls.create_if_absent(JOB))


@pytest.mark.parametrize("status", [400, 403, 422])
def test_a_refusal_no_retry_can_change_is_reported_with_the_servers_message(
    monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    # Retried every 5 s forever, it left a stale status and no event.
    _answer(monkeypatch, status, 'Job.batch "run-a" is invalid: spec.template.spec.tolerations[0].operator: ...')
    with pytest.raises(api_calls.ChildRejected) as err:
        asyncio.run(api_calls.create_if_absent(JOB))
    assert "create Job run-a" in str(err.value) and "tolerations[0].operator" in str(err.value)
    _answer(monkeypatch, status, "x" * 10_000)
    with pytest.raises(api_calls.ChildRejected) as err:
        asyncio.run(api_calls.create_if_absent(JOB))
    assert len(str(err.value)) <= 2048


def test_no_answer_at_all_is_a_retry_not_an_unexpected_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    # An API server outage used to surface as "failed unexpectedly" with a traceback per reconcile.
    def refused(manifest: dict[str, Any]) -> None:
        raise urllib3.exceptions.MaxRetryError(None, "/apis", ConnectionRefusedError(111, "Connection refused"))

    monkeypatch.setattr(api_calls, "_create", refused)
    with pytest.raises(kopf.TemporaryError, match="API server unreachable"):
        asyncio.run(api_calls.create_if_absent(JOB))


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


class _FakeCore:
    """CoreV1Api's two calls job_log makes: a Job's pods, and one pod's log as raw bytes."""

    def __init__(self, pods: list[tuple[str, int]], log: bytes) -> None:
        from types import SimpleNamespace

        self.pods = [SimpleNamespace(metadata=SimpleNamespace(name=n, creation_timestamp=t)) for n, t in pods]
        self.log = log
        self.read: list[tuple[str, int]] = []

    def __call__(self, _api: Any) -> _FakeCore:
        return self

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        from types import SimpleNamespace

        assert label_selector == "job-name=run-a-job"
        return SimpleNamespace(items=self.pods)

    def read_namespaced_pod_log(self, name: str, namespace: str, *, tail_lines: int, **_: Any) -> Any:
        from types import SimpleNamespace

        self.read.append((name, tail_lines))
        return SimpleNamespace(data=self.log)


def test_a_failed_jobs_newest_pod_log_is_read_and_its_absence_is_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeCore([("run-a-job-first", 1), ("run-a-job-retry", 2)], b"loading\nKilled\xff\n")
    monkeypatch.setattr(api_calls.client, "CoreV1Api", fake)
    assert asyncio.run(api_calls.job_log("ns", "run-a-job", 20)) == "loading\nKilled\ufffd\n"
    assert fake.read == [("run-a-job-retry", 20)], "the last attempt's pod"
    monkeypatch.setattr(api_calls.client, "CoreV1Api", _FakeCore([], b""))
    assert asyncio.run(api_calls.job_log("ns", "run-a-job", 20)) is None

    def forbidden(*_: Any, **__: Any) -> Any:
        raise ApiException(status=403, reason="Forbidden")

    refusing = _FakeCore([("p", 1)], b"")
    refusing.read_namespaced_pod_log = forbidden  # type: ignore[method-assign]
    monkeypatch.setattr(api_calls.client, "CoreV1Api", refusing)
    assert asyncio.run(api_calls.job_log("ns", "run-a-job", 20)) is None


def test_a_log_tail_is_the_last_lines_printable_and_bounded_from_the_end() -> None:
    from metainfer.core.control.logtail import log_tail

    text = "".join(f"line {i}\n" for i in range(100)) + "\x1b[31mMemoryError\x1b[0m\n"
    tail = log_tail(text, lines=3)
    assert tail == "line 98\nline 99\n?[31mMemoryError?[0m"
    huge = log_tail("x" * 100_000 + "\nthe error", limit=100)
    assert len(huge) == 100 and huge.endswith("the error") and huge.startswith("...")
