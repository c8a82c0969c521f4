"""Namespaced mode: release the policies of watched namespaces that were already being deleted at startup.

kopf (1.45, ``observation.revise_namespaces``) does not start watching a
namespace that is Terminating when the operator starts. A namespace deleted
while the operator was down therefore kept kopf's finalizer on its policies,
and stayed Terminating forever, across restarts. At startup the operator takes
its own finalizer off the deleted policies of those namespaces itself: the
policy's daemon is all that finalizer guards (the children are owned by the
policy and go with the namespace). Namespaces deleted while the operator runs
are watched already and handled by kopf as usual.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, cast

import kopf
from kopf._cogs.structs.references import match_namespace  # the exact semantics of --namespace patterns
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from metainfer.core.api.names import FINALIZER, GROUP, POLICY_PLURAL, VERSION
from metainfer.operator.startup import load_client_config

WATCHED_PATTERNS: list[str] = []  # set by main.run before kopf starts; empty: cluster-wide, nothing to do


def terminating_watched(namespaces: Iterable[Any], patterns: Iterable[str]) -> list[str]:
    """Names of the namespaces being deleted that one of ``patterns`` selects."""
    patterns = list(patterns)
    return [
        ns.metadata.name
        for ns in namespaces
        if ns.metadata.deletion_timestamp is not None
        and any(match_namespace(ns.metadata.name, pattern) for pattern in patterns)
    ]


def without_finalizer(policy: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A JSON patch removing our finalizer from a policy being deleted (guarded by a test of the list), or None."""
    metadata = policy.get("metadata", {})
    finalizers = list(metadata.get("finalizers") or [])
    if not metadata.get("deletionTimestamp") or FINALIZER not in finalizers:
        return None
    return [
        {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
        {"op": "replace", "path": "/metadata/finalizers", "value": [f for f in finalizers if f != FINALIZER]},
    ]


def _release(patterns: list[str], logger: kopf.Logger) -> list[str]:
    # kopf runs startup activities in registration order, which is import order: never rely on startup's
    # on_startup having loaded the client's configuration first (a reordered import once broke that).
    load_client_config()
    api = client.ApiClient()
    released = []
    for namespace in terminating_watched(client.CoreV1Api(api).list_namespace().items, patterns):
        custom = client.CustomObjectsApi(api)
        listing = cast(dict[str, Any], custom.list_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL))
        for policy in listing["items"]:
            patch = without_finalizer(policy)
            if patch is None:
                continue
            name = policy["metadata"]["name"]
            try:
                custom.patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, POLICY_PLURAL, name, patch,
                    _content_type="application/json-patch+json", _request_timeout=30,
                )  # fmt: skip
            except ApiException as exc:
                if exc.status not in (404, 409, 422):  # gone, or changed under us: nothing of ours to release
                    raise
                continue
            logger.info("released policy %s/%s: its namespace was deleted while the operator was down", namespace, name)
            released.append(f"{namespace}/{name}")
    return released


@kopf.on.startup()
async def release_terminating_namespaces(logger: kopf.Logger, **_: Any) -> None:
    if WATCHED_PATTERNS:
        await asyncio.to_thread(_release, list(WATCHED_PATTERNS), logger)
