"""kopf handlers: watch, index, wake the policy's daemon, apply its Plan.

Run with ``metainfer operator`` or ``kopf run -m metainfer.operator.handlers
--all-namespaces``. Each AdaptationPolicy gets a daemon that reconciles when
something it depends on changes (its runs, Jobs, Deployments, any node) and at
least every ``resync_seconds``; what to do comes from ``core.control.reconcile``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import time
from typing import Any

import kopf
from pydantic import ValidationError

from metainfer.core.api.names import GROUP, LABEL_POLICY, MANAGED_BY, POLICY_PLURAL, PRODUCT, RUN_PLURAL, VERSION
from metainfer.core.api.vocabulary import IN_FLIGHT
from metainfer.core.control.objects import run_phase_from_body
from metainfer.core.control.platform import ForbiddenByPlatform
from metainfer.core.control.schedulability import NodeScheduling
from metainfer.core.control.slim import slim_deployment, slim_job, slim_run
from metainfer.operator import api_calls, namespaces, startup  # noqa: F401  (startup handlers; startup's runs first)
from metainfer.operator.api_calls import ChildRejected, StaleRead
from metainfer.operator.apply import apply_plan, reconcile_inputs, refusal, refused_status
from metainfer.operator.drift import drift_step, fetch_policy
from metainfer.operator.metrics import RECONCILE_ERRORS, RECONCILE_SECONDS, SERIES
from metainfer.operator.rollout import rollout_step
from metainfer.operator.view import ClusterView, Indexes, Wakeups
from metainfer.operator.waits import job_waits, next_look_s, rollout_waits

MANAGED = {MANAGED_BY: PRODUCT}
VIEW = ClusterView()
WAKEUPS = Wakeups()


@kopf.on.startup()
def load_label_mapping(logger: kopf.Logger, **_: Any) -> None:
    """A cluster with its own node labels supplies a LabelMapping file; a bad file stops the operator at once."""
    from metainfer.core.control.hardware import LabelMapping
    from metainfer.core.engine.errors import InputError
    from metainfer.operator.config import ConfigError, OperatorConfig

    try:
        path = OperatorConfig().label_mapping_file
    except ConfigError as exc:  # on_startup names it too; retrying cannot fix it
        raise kopf.PermanentError(str(exc)) from exc
    if path is None:
        return
    try:
        VIEW.mapping = LabelMapping.from_file(path)
    except InputError as exc:
        raise kopf.PermanentError(f"METAINFER_LABEL_MAPPING_FILE: {exc}") from exc
    VIEW.nodes_changed()
    logger.info("label mapping loaded from %s", path)


@kopf.index("", "v1", "nodes")
async def nodes_index(*, name: str, labels: kopf.Labels, **_: Any) -> dict[str, dict[str, str]]:
    return {name: dict(labels)}


@kopf.index("", "v1", "nodes")
async def node_scheduling_index(*, name: str, spec: kopf.Spec, **_: Any) -> dict[str, dict[str, Any]]:
    """Cordoned, and the taints that keep pods off (core.control.schedulability): such nodes form no class."""
    return {name: NodeScheduling.read(spec).to_index()}


# Every index function is async, though none awaits: kopf runs a sync handler in a worker thread, and that hop
# (with the GIL passed back and forth) cost more than the function itself on each of the ~20,000 events of 2,000
# runs and Jobs starting. They are pure and quick, so the event loop runs them directly.
#
# The indexes keep only what the reconcile reads (core.control.slim): full copies of 4,000 child objects are
# most of the operator's memory at 100 policies x 20 classes. They stay plain mappings: the reconcile validates
# only the runs of the policy it plans, not every run of the cluster on every event.
@kopf.index(GROUP, VERSION, RUN_PLURAL)
async def runs_index(*, namespace: str | None, body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return {(namespace or "", body.get("spec", {}).get("policyName", "")): slim_run(body)}


@kopf.index(GROUP, VERSION, RUN_PLURAL)
async def in_flight_index(*, namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[str, tuple[str, str]]:
    """Pending and Running runs by namespace, so the cluster's and a namespace's limits are len()s: a scan of every
    run per reconcile is quadratic (1.3 M run_phase calls while 100 policies converge).

    A run that is no longer in flight maps to ``{}``, never None: kopf keeps an object's earlier entry when its
    handler returns None, so a finished run held its slot until the operator restarted (the namespace's fifth run
    waited at ConcurrencyLimit for ever)."""
    namespace = namespace or ""  # runs are namespaced: kopf always names it
    return {namespace: (namespace, name)} if run_phase_from_body(body) in IN_FLIGHT else {}


@kopf.index("batch", "v1", "jobs", labels=MANAGED)
async def jobs_index(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    return {(namespace or "", name): slim_job(body)}


async def services_index(*, namespace: str | None, name: str, **_: Any) -> dict[tuple[str, str], bool]:
    return {(namespace or "", name): True}


@kopf.index("apps", "v1", "deployments", labels=MANAGED)
async def deployments_index(*, namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace or "", labels.get(LABEL_POLICY, "")): slim_deployment(body)}


# The wake-up handlers are async so kopf runs them on the event loop: asyncio.Event is not thread-safe, and set()
# from kopf's sync-handler threads schedules the sleeping daemon's wake-up without waking the loop, so the daemon
# reconciled only at its next resync (60 s by default) instead of at once.
@kopf.on.event("", "v1", "nodes")
async def on_node(**_: Any) -> None:
    VIEW.nodes_changed()
    WAKEUPS.wake_all()


@kopf.on.event(GROUP, VERSION, RUN_PLURAL)
async def on_run(*, namespace: str | None, body: kopf.Body, **_: Any) -> None:
    WAKEUPS.wake(namespace, body.get("spec", {}).get("policyName"))


@kopf.on.event("batch", "v1", "jobs", labels=MANAGED)
@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
async def on_child(*, namespace: str | None, labels: kopf.Labels, **_: Any) -> None:
    WAKEUPS.wake(namespace, labels.get(LABEL_POLICY))


def watch_services() -> None:
    """Index the Services the operator manages and wake their policy on each change: registered before kopf
    starts, by ``metainfer operator``, only where the operator may list and watch services (capabilities.py)."""
    kopf.index("", "v1", "services", labels=MANAGED)(services_index)
    kopf.on.event("", "v1", "services", labels=MANAGED)(on_child)


# kopf passes each index as an extra keyword named after its handler, which its DaemonFn protocol (every keyword
# fixed) cannot express; and a policy is namespaced, so kopf always gives a namespace.
@kopf.daemon(GROUP, VERSION, POLICY_PLURAL, cancellation_timeout=10.0)  # type: ignore[arg-type]  # see above
async def policy_daemon(
    stopped: kopf.DaemonStopped,
    name: str,
    namespace: str,
    body: kopf.Body,
    logger: logging.Logger,
    nodes_index: kopf.Index[str, dict[str, str]],
    runs_index: kopf.Index[tuple[str, str], dict[str, Any]],
    jobs_index: kopf.Index[tuple[str, str], dict[str, Any]],
    deployments_index: kopf.Index[Any, dict[str, Any]],
    in_flight_index: kopf.Index[str, tuple[str, str]],
    node_scheduling_index: kopf.Index[str, dict[str, Any]],
    **optional: Any,
) -> None:
    from metainfer.operator.config import OperatorConfig

    config = OperatorConfig()
    # Absent unless watch_services() registered it. Not `or {}`: an Index with no Services yet is falsy, and the
    # daemon would keep the empty dict for life (the scale benchmark caught 300 creates per label change again).
    services = optional.get("services_index", {})
    indexes = Indexes(nodes_index, runs_index, jobs_index, deployments_index, in_flight_index, node_scheduling_index,
                      services)  # fmt: skip
    wake = WAKEUPS.register(namespace, name)
    stale_reads = 0  # in a row: two writers that keep disagreeing back off instead of spinning
    try:
        while not stopped:
            wake.clear()
            started = time.perf_counter()
            sleep = config.resync_seconds
            policy = _plain(body)
            try:
                # Fresh, not kopf's body: the watch may lag behind this daemon's own last status write.
                policy = await fetch_policy(namespace, name) or policy
                pods = await provisional_pods(namespace, name, indexes)
                waits = await job_waits(namespace, name, indexes)
                rollouts = await rollout_waits(namespace, name, indexes)
                inputs = reconcile_inputs(policy, VIEW, indexes, config, pods, waits, rollouts)
                if inputs.settle_wait_s is not None:
                    sleep = min(sleep, max(inputs.settle_wait_s, 0.5))
                if (look_s := next_look_s(namespace, name, indexes, config.wait_for_available)) is not None:
                    sleep = min(sleep, look_s)
                policy = await apply_plan(body, inputs, logger)
                # spec.suspend holds the loop: no drift check, no canary decision (apply_plan created nothing).
                if not (policy.get("spec") or {}).get("suspend"):
                    checked = await drift_step(body, policy, config, logger, dt.datetime.now(dt.UTC))
                    if checked.readapt:
                        continue  # reconcile at once: the salted run key creates the LatencyDrift run
                    if checked.next_check_s is not None:
                        sleep = min(sleep, max(checked.next_check_s, 0.5))
                    policy = checked.policy or policy
                    canary = await rollout_step(body, policy, config, logger, dt.datetime.now(dt.UTC))
                    if canary.decided:
                        continue  # reconcile at once: promote (new stable) or roll back (delete the canary)
                    if canary.next_check_s is not None:
                        sleep = min(sleep, max(canary.next_check_s, 0.5))
            except (ValidationError, ForbiddenByPlatform, ChildRejected) as exc:  # no retry fixes it: say so on it
                reason, message = refusal(exc)
                RECONCILE_ERRORS.labels(reason).inc()
                if isinstance(exc, ChildRejected):
                    logger.warning("reconcile of %s/%s: %s", namespace, name, message)
                try:
                    await refused_status(body, policy, reason, message)
                except StaleRead as stale:  # planned from an old read: read again, and refuse again if it holds
                    stale_reads += 1
                    await _after_stale_read(stale, stale_reads, stopped, logger)
                    continue
            except StaleRead as exc:  # someone wrote the policy since it was read: plan again from what is there now
                stale_reads += 1
                await _after_stale_read(exc, stale_reads, stopped, logger)
                continue
            except kopf.TemporaryError as exc:
                RECONCILE_ERRORS.labels("Temporary").inc()
                logger.warning("reconcile of %s/%s will be retried: %s", namespace, name, exc)
                await stopped.wait(exc.delay or 5)
                continue
            except Exception:  # a bug must not stop this policy's daemon for good: log, back off, retry
                RECONCILE_ERRORS.labels("Unexpected").inc()
                logger.exception("reconcile of %s/%s failed unexpectedly; retrying in %ss", namespace, name, 10)
                await stopped.wait(10)
                continue
            finally:
                RECONCILE_SECONDS.observe(time.perf_counter() - started)
            stale_reads = 0
            await _sleep_until_woken(wake, stopped, sleep)
    finally:
        WAKEUPS.unregister(namespace, name)
        SERIES.forget(namespace, name)


async def _after_stale_read(exc: StaleRead, in_a_row: int, stopped: kopf.DaemonStopped, logger: logging.Logger) -> None:
    """Read again at once after one refused write; after several in a row, wait a growing, jittered while (up to
    STALE_READ_MAX_WAIT_S), so that another writer that keeps writing is not raced by a tight loop."""
    RECONCILE_ERRORS.labels("StaleRead").inc()
    logger.info("%s (%d in a row)", exc, in_a_row)
    if in_a_row > 1:
        await stopped.wait(min(STALE_READ_MAX_WAIT_S, 0.1 * 2 ** (in_a_row - 2)) * random.uniform(0.5, 1.0))


STALE_READ_MAX_WAIT_S = 5.0


# A wake-up comes in bursts: a reconcile that creates 20 runs, their Jobs and the runs' statuses hears about each
# of those 60 writes. Waiting this long after the first folds what arrives meanwhile into the same reconcile (each
# plans every class of the policy) instead of one per arrival on a slower API server. It is small beside what a
# reaction takes anyway (the API round trips, the class settle time).
WAKE_DEBOUNCE_S = 0.25


async def _sleep_until_woken(wake: asyncio.Event, stopped: kopf.DaemonStopped, timeout: float) -> None:
    waiter = asyncio.ensure_future(wake.wait())
    stopper = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({waiter, stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        stopper.cancel()
    if wake.is_set() and not stopped:
        await stopped.wait(WAKE_DEBOUNCE_S)


async def provisional_pods(namespace: str, name: str, indexes: Indexes) -> list[dict[str, Any]]:
    """The policy's provisional pods, whose on-node checks its status reports; listed only while one of its
    Deployments is provisional (most reconciles have none, and need no call)."""
    if not indexes.has_provisional(namespace, name):
        return []
    return await api_calls.provisional_pods(namespace, name)


def _plain(body: Any) -> dict[str, Any]:
    """A detached copy: kopf bodies are live views that change under the reconcile."""
    import copy

    return copy.deepcopy(dict(body))
