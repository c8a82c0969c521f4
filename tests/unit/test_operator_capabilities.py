"""The Services watch is registered only where the operator's RBAC lets it list and watch services everywhere it
serves: an operator image under an older chart's ClusterRole must start and reconcile as before."""

from __future__ import annotations

import pytest

from metainfer.operator.capabilities import can_watch, scopes_to_check


def test_a_cluster_wide_operator_asks_at_the_cluster_scope() -> None:
    assert scopes_to_check([]) == [""]


def test_named_namespaces_are_each_asked_once() -> None:
    assert scopes_to_check(["team-b", "team-a, team-b"]) == ["team-a", "team-b"]


@pytest.mark.parametrize("pattern", ["team-*", "team-?", "!kube-system", "team-a, !team-b", " , "])
def test_a_pattern_that_names_no_fixed_set_of_namespaces_cannot_be_asked(pattern: str) -> None:
    assert scopes_to_check([pattern]) is None


def test_both_list_and_watch_are_needed_in_every_scope() -> None:
    asked: list[tuple[str, str, str]] = []

    def grants(verb: str, resource: str, namespace: str) -> bool:
        asked.append((verb, resource, namespace))
        return not (verb == "watch" and namespace == "team-b")

    assert not can_watch("services", ["team-a", "team-b"], grants)
    assert ("list", "services", "team-a") in asked and ("watch", "services", "team-b") in asked
    assert can_watch("services", ["team-a"], grants)


def test_the_previous_charts_grant_create_patch_delete_is_not_enough() -> None:
    previous_chart = {"create", "patch", "delete"}
    assert not can_watch("services", [], lambda verb, resource, namespace: verb in previous_chart)
    assert can_watch("services", [], lambda verb, resource, namespace: verb in previous_chart | {"list", "watch"})


def test_a_glob_never_asks_and_never_watches() -> None:
    def unasked(verb: str, resource: str, namespace: str) -> bool:
        raise AssertionError("nothing to ask for a glob")

    assert not can_watch("services", ["team-*"], unasked)


def test_an_api_server_that_cannot_be_asked_leaves_the_watch_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.client.exceptions import ApiException

    from metainfer.operator import capabilities, main, startup

    def unreachable(verb: str, resource: str, namespace: str) -> bool:
        raise ApiException(status=503, reason="Service Unavailable")

    monkeypatch.setattr(startup, "load_client_config", lambda: None)
    monkeypatch.setattr(capabilities, "self_subject_access", unreachable)
    assert main.services_watch_allowed([]) is False
    monkeypatch.setattr(capabilities, "self_subject_access", lambda verb, resource, namespace: True)
    assert main.services_watch_allowed(["team-a"]) is True
    assert main.services_watch_allowed(["team-*"]) is False


def test_the_policy_daemon_keeps_kopfs_services_index_even_while_it_is_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf hands the daemon a live Index, empty until the first Service arrives; swapping an empty (falsy) one
    for a dict of its own made every daemon started before its Service exist blind to it for life."""
    import asyncio
    import logging
    from collections.abc import Iterator, Mapping
    from typing import Any

    from metainfer.operator import handlers

    class LiveIndex(Mapping[Any, Any]):  # empty now, filled later by kopf, like kopf.Index
        def __getitem__(self, key: Any) -> Any:
            raise KeyError(key)

        def __iter__(self) -> Iterator[Any]:
            return iter(())

        def __len__(self) -> int:
            return 0

    built: list[Any] = []
    monkeypatch.setattr(handlers, "Indexes", lambda *args: built.append(args) or args)
    live = LiveIndex()
    stopped = True  # kopf's DaemonStopped is truthy once stopped: the daemon builds its indexes and returns
    indexes: list[Any] = [{}, {}, {}, {}, {}, {}]
    log = logging.getLogger("test")
    asyncio.run(handlers.policy_daemon(stopped, "p", "ns", {}, log, *indexes, services_index=live))  # type: ignore[arg-type]
    assert built and built[0][-1] is live
    asyncio.run(handlers.policy_daemon(stopped, "p", "ns", {}, log, *indexes))  # type: ignore[arg-type]
    assert built[1][-1] == {}, "without the watch the daemon plans every Service, as before"
