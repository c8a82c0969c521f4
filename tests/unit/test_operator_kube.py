"""How the operator's writes classify the API server's answers: done, retry, or refused for good."""

from __future__ import annotations

import asyncio
import json
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
