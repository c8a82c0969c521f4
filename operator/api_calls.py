"""The operator's calls to the API server, for kopf handlers: idempotent writes, and the reads that explain
a run or a wait (a Job's log, pods and events, provisional pods, a ServiceAccount, a policy as stored now).

Every child object has a deterministic name, so "create" means "create if
absent": a 409 is success. That, and never keeping state in memory, is what
lets a restarted (or SIGKILLed) operator resume without a second run or Job.
Calls use the synchronous client in a worker thread so the event loop keeps
serving other policies while one waits on the API server.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from metainfer.core.api.names import (
    COMPONENT,
    GROUP,
    LABEL_POLICY,
    LABEL_PROVISIONAL,
    MANAGED_BY,
    RUN_KIND,
    RUN_PLURAL,
    VERSION,
)
from metainfer.core.control.naming import label_value

TRANSIENT = {409, 429, 500, 502, 503, 504}
_SHARED: client.ApiClient | None = None


def _api() -> client.ApiClient:
    """One ApiClient for every write: ``client.XxxApi()`` without one builds a new connection pool per call, so
    every request paid a TLS handshake (both sides' CPU) instead of reusing a kept-alive connection. Created on
    first use, after the startup handler has loaded the kubeconfig into the default configuration; urllib3's pool
    is thread-safe, and the calls run in worker threads."""
    global _SHARED
    if _SHARED is None:
        _SHARED = client.ApiClient()
    return _SHARED


# Answers that a retry cannot change: the object as built is invalid (400, 422) or the operator may not create it
# (403). Retrying every 5 s forever left a stale status and no event; the policy's status says why instead.
REJECTED = {400, 403, 422}


class ChildRejected(Exception):
    """The API server refused a child object for good; the message is the server's own, bounded."""

    def __init__(self, what: str, exc: ApiException) -> None:
        detail = ""
        try:
            detail = str(json.loads(exc.body or "{}").get("message", ""))
        except (ValueError, AttributeError):
            detail = ""
        super().__init__(f"the API server refused to {what}: {exc.status} {exc.reason}: {detail}"[:2048])


async def _in_thread(what: str, call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)`` in a worker thread; no answer at all (refused, reset, timed out) is a retry, not a bug."""
    try:
        return await asyncio.to_thread(call, *args)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise kopf.TemporaryError(f"{what}: API server unreachable ({type(exc).__name__})", delay=5) from exc


def _temporary(exc: ApiException, what: str) -> kopf.TemporaryError | ChildRejected:
    if exc.status in REJECTED:
        return ChildRejected(what, exc)
    return kopf.TemporaryError(f"{what}: API server answered {exc.status} {exc.reason}", delay=5)


async def create_if_absent(manifest: Mapping[str, Any]) -> bool:
    """Create ``manifest``; False if it already existed."""
    try:
        await _in_thread(f"create {manifest['kind']} {manifest['metadata']['name']}", _create, dict(manifest))
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise _temporary(exc, f"create {manifest['kind']} {manifest['metadata']['name']}") from exc
    return True


# A ServiceAccount seen to exist is not looked up again for this long: the check only explains pods that will
# never start, and one GET per Job was a third of the operator's requests while 2,000 runs started at once.
ACCOUNT_SEEN_TTL_S = 300.0
_ACCOUNTS_SEEN: dict[tuple[str, str], float] = {}


async def service_account_missing(namespace: str, name: str) -> bool:
    """True only when the API server says the ServiceAccount does not exist (not when we may not look)."""
    seen = _ACCOUNTS_SEEN.get((namespace, name))
    if seen is not None and time.monotonic() - seen < ACCOUNT_SEEN_TTL_S:
        return False
    try:
        await _in_thread(
            f"get serviceaccount {name}", client.CoreV1Api(_api()).read_namespaced_service_account, name, namespace
        )
    except ApiException as exc:
        if exc.status == 404:
            _ACCOUNTS_SEEN.pop((namespace, name), None)
            return True
        if exc.status == 403:
            return False  # a chart without the `get serviceaccounts` rule: the Job's own events will say it
        raise _temporary(exc, f"get serviceaccount {namespace}/{name}") from exc
    _ACCOUNTS_SEEN[(namespace, name)] = time.monotonic()
    return False


async def apply(manifest: Mapping[str, Any]) -> None:
    """Create, or update an existing object to ``manifest``: a Deployment is replaced (its spec exactly as built,
    our labels and annotations as built, others' kept: ``replaced``), a Service's selector and ports patched."""
    if await create_if_absent(manifest):
        return
    # Annotations too: the reconcile compares its spec-hash annotation, so an update that left the old hash would
    # be re-applied forever and the class would never be Ready again.
    meta = manifest["metadata"]
    patch = {
        "metadata": {"labels": meta.get("labels", {}), "annotations": meta.get("annotations", {})},
        "spec": manifest["spec"],
    }
    try:
        await _in_thread(f"update {manifest['kind']} {manifest['metadata']['name']}", _patch, manifest, patch)
    except ApiException as exc:
        raise _temporary(exc, f"update {manifest['kind']} {manifest['metadata']['name']}") from exc


async def delete(kind: str, namespace: str, name: str) -> None:
    try:
        await _in_thread(f"delete {kind} {name}", _delete, kind, namespace, name)
    except ApiException as exc:
        if exc.status != 404:
            raise _temporary(exc, f"delete {kind} {name}") from exc


class StaleRead(kopf.TemporaryError):
    """The object changed after the reconcile read it: its status write was refused, and the reconcile reads again."""


async def patch_status(
    plural: str, namespace: str, name: str, status: Mapping[str, Any], *, read_at: str | None = None
) -> dict[str, Any] | None:
    """Merge-patch the status subresource; the object as stored after the patch (None once deleted).

    With ``read_at`` (the resourceVersion the status was computed from) the write is conditional: a status planned
    from an older read (a replica still finishing its reconcile while a hand-over gives the policy to another, or a
    write of the user's in between) would put back a class list that has moved on (a promoted canary, a finished
    run). The API server refuses it with 409 instead, raised as StaleRead.
    """
    api = client.CustomObjectsApi(_api())
    patch: dict[str, Any] = {"status": status}
    if read_at:
        patch["metadata"] = {"resourceVersion": read_at}
    try:
        stored = await _in_thread(
            f"patch status of {plural}/{name}",
            api.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            patch,
        )
    except ApiException as exc:
        if exc.status == 409 and read_at:
            raise StaleRead(
                f"{plural}/{name} changed after it was read at resourceVersion {read_at}: planning again", delay=0
            ) from exc
        if exc.status != 404:
            raise _temporary(exc, f"patch status of {plural}/{name}") from exc
        return None
    return dict(stored)


def read_at(obj: Mapping[str, Any]) -> str | None:
    """The resourceVersion ``obj`` was read at, for a conditional ``patch_status``."""
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return str(version) if version else None


async def job_log(namespace: str, job_name: str, lines: int) -> str | None:
    """The last ``lines`` lines of the newest pod of a Job (its last attempt), None when there is no pod or log to
    read (gone with its node, a chart without the pods/log rule): the run's failure stands without it."""
    core = client.CoreV1Api(_api())

    def read() -> str | None:
        pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={job_name}").items
        attempts = sorted(
            (p.metadata.creation_timestamp, p.metadata.name)
            for p in pods
            if p.metadata is not None and p.metadata.name and p.metadata.creation_timestamp is not None
        )
        if not attempts:
            return None
        # Unparsed: the client would decode the body as JSON; a log is text, cut by the server at limit_bytes.
        response: Any = core.read_namespaced_pod_log(
            attempts[-1][1], namespace, tail_lines=lines, limit_bytes=64 * 1024, _preload_content=False
        )
        text = response.data
        return bytes(text).decode("utf-8", errors="replace")

    try:
        return cast(str | None, await _in_thread(f"read the log of Job {job_name}", read))
    except (ApiException, kopf.TemporaryError):
        return None  # a log is a courtesy: never a reason to retry the whole reconcile


def _pods(namespace: str, label_selector: str) -> list[dict[str, Any]]:
    """Pods as plain camelCase dicts, as core.control reads pods (in a worker thread)."""
    api = _api()
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=label_selector).items
    return [api.sanitize_for_serialization(p) for p in pods]


def _pods_of(namespace: str, job_name: str) -> list[dict[str, Any]]:
    """A Job's pods (in a worker thread)."""
    return _pods(namespace, f"job-name={job_name}")


async def job_pods(namespace: str, job_name: str) -> list[dict[str, Any]]:
    """The pods of a Job as plain camelCase dicts (what ended a failed run's pod: core.control.pod_endings);
    none when they cannot be listed: the run's failure then stands as the Job controller said it."""
    try:
        return cast(
            list[dict[str, Any]], await _in_thread(f"list the pods of Job {job_name}", _pods_of, namespace, job_name)
        )
    except Exception:  # a courtesy, as the log tail is: the run's failure stands without it
        return []


async def pods_selected(namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]] | None:
    """The pods carrying ``labels`` (a Deployment's selector) as plain camelCase dicts (core.control.rollout_waits
    reads them); None when they cannot be listed (the wait then stays as last explained)."""
    selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
    try:
        return cast(list[dict[str, Any]], await _in_thread(f"list the pods of {selector}", _pods, namespace, selector))
    except Exception:  # an explanation is a courtesy: never a reason to fail or retry the whole reconcile
        return None


async def job_wait_evidence(namespace: str, job_name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """The pods of a Job and, when none is on its way, the Job controller's FailedCreate events about it, as plain
    camelCase dicts (core.control.job_waits reads them); None when they cannot be read (the wait then stays as
    last explained)."""
    api = _api()
    core = client.CoreV1Api(api)

    def read() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        pods = _pods_of(namespace, job_name)
        if any((p.get("status") or {}).get("phase") in ("Pending", "Running") for p in pods):
            return pods, []  # its pod says why, if anything does
        # The reason in the selector: a list is oldest first, and a Job's other events must not crowd out its latest.
        selector = f"involvedObject.kind=Job,involvedObject.name={job_name},reason=FailedCreate"
        events = core.list_namespaced_event(namespace, field_selector=selector).items
        return pods, [api.sanitize_for_serialization(e) for e in events]

    try:
        return cast(
            tuple[list[dict[str, Any]], list[dict[str, Any]]],
            await _in_thread(f"read why Job {job_name} waits", read),
        )
    except Exception:  # an explanation is a courtesy: never a reason to fail or retry the whole reconcile
        return None


async def provisional_pods(namespace: str, policy: str) -> list[dict[str, Any]]:
    """The policy's provisional serving pods (core.control.pod_checks reads their on-node checks), as plain
    camelCase dicts; none when they cannot be listed: the status then says only that the pods check first."""
    api = _api()
    core = client.CoreV1Api(api)
    selector = f"{LABEL_POLICY}={label_value(policy)},{LABEL_PROVISIONAL}=true"

    def listed() -> list[dict[str, Any]]:
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        return [api.sanitize_for_serialization(pod) for pod in pods]

    try:
        return cast(list[dict[str, Any]], await _in_thread(f"list the provisional pods of {policy}", listed))
    except (ApiException, kopf.TemporaryError):
        return []


async def get_custom(plural: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The object as the API server has it now (None once deleted)."""
    api = client.CustomObjectsApi(_api())
    try:
        obj = await _in_thread(
            f"get {plural}/{name}", api.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise _temporary(exc, f"get {plural}/{name}") from exc
    return dict(obj)


# Writes whose answer the operator does not read are sent with _preload_content=False: the client then neither
# parses the JSON nor builds its model classes from it (a V1Job per created Job; with 2,000 runs starting at once
# that was CPU the event loop waited for, in threads holding the GIL). A non-2xx answer still raises ApiException,
# with the server's body. The raw answer is drained so its connection goes back to the pool.
def _drained(response: Any) -> None:
    response.read()
    response.release_conn()


def _create(manifest: dict[str, Any]) -> None:
    kind, ns = manifest["kind"], manifest["metadata"]["namespace"]
    body: Any = manifest  # the client sends a plain dict as it is; its hints name only its own model classes
    if kind == RUN_KIND:
        created = client.CustomObjectsApi(_api()).create_namespaced_custom_object(
            GROUP, VERSION, ns, RUN_PLURAL, manifest, _preload_content=False
        )
    elif kind == "Job":
        created = client.BatchV1Api(_api()).create_namespaced_job(ns, body, _preload_content=False)
    elif kind == "Deployment":
        created = client.AppsV1Api(_api()).create_namespaced_deployment(ns, body, _preload_content=False)
    elif kind == "Service":
        created = client.CoreV1Api(_api()).create_namespaced_service(ns, body, _preload_content=False)
    elif kind == "PodDisruptionBudget":
        created = client.PolicyV1Api(_api()).create_namespaced_pod_disruption_budget(ns, body, _preload_content=False)
    else:
        raise ValueError(f"no create for kind {kind}")
    _drained(created)


def _patch(manifest: Mapping[str, Any], patch: dict[str, Any]) -> None:
    kind, ns, name = manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    if kind == "Deployment":
        apps = client.AppsV1Api(_api())
        stored = _api().sanitize_for_serialization(apps.read_namespaced_deployment(name, ns))
        # Replaced, not merge-patched: a merge keeps whatever the new spec leaves out (a provisional pod's init
        # container and its resource requests, an unmounted ConfigMap volume) and pods kept running stale parts.
        # The resourceVersion makes a concurrent writer's change a conflict (409: retried), never lost.
        apps.replace_namespaced_deployment(name, ns, replaced(stored, manifest))  # type: ignore[arg-type]  # a dict body is sent as is
    elif kind == "Service":
        # ClusterIP is immutable and assigned by the server: only selector/ports are ours.
        spec = {k: v for k, v in patch["spec"].items() if k in ("selector", "ports")}
        client.CoreV1Api(_api()).patch_namespaced_service(name, ns, {"metadata": patch["metadata"], "spec": spec})
    else:
        raise ValueError(f"no update for kind {kind}")


def replaced(stored: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """``stored`` (as read, with its resourceVersion) carrying ``desired``'s spec, and its labels and annotations
    where they are ours: others' labels and annotations stay, ours that ``desired`` dropped go."""
    meta = dict(stored.get("metadata") or {})
    wanted = desired.get("metadata") or {}
    for field in ("labels", "annotations"):
        theirs = {k: v for k, v in (meta.get(field) or {}).items() if not _ours(k)}
        meta[field] = {**theirs, **(wanted.get(field) or {})}
    return {"apiVersion": desired.get("apiVersion", stored.get("apiVersion")), "kind": desired["kind"],
            "metadata": meta, "spec": desired["spec"]}  # fmt: skip


def _ours(key: str) -> bool:
    return key.split("/", 1)[0] == GROUP or key in (MANAGED_BY, COMPONENT)


def _delete(kind: str, namespace: str, name: str) -> None:
    background = client.V1DeleteOptions(propagation_policy="Background")
    if kind == "Deployment":
        deleted = client.AppsV1Api(_api()).delete_namespaced_deployment(
            name, namespace, body=background, _preload_content=False
        )
    elif kind == "Service":
        deleted = client.CoreV1Api(_api()).delete_namespaced_service(name, namespace, _preload_content=False)
    elif kind == "PodDisruptionBudget":
        deleted = client.PolicyV1Api(_api()).delete_namespaced_pod_disruption_budget(
            name, namespace, _preload_content=False
        )
    elif kind == "Job":
        deleted = client.BatchV1Api(_api()).delete_namespaced_job(
            name, namespace, body=background, _preload_content=False
        )
    elif kind == RUN_KIND:
        deleted = client.CustomObjectsApi(_api()).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, RUN_PLURAL, name, body=background, _preload_content=False
        )
    else:
        raise ValueError(f"no delete for kind {kind}")
    _drained(deleted)
