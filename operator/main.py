"""``metainfer operator``: run the kopf operator in this process.

Equivalent to ``kopf run -m metainfer.operator.handlers --all-namespaces``
plus metainfer's defaults (liveness endpoint, peering). Importing the
handlers module registers every handler; settings are applied on startup.

When one of kopf's root tasks ends (a stop signal, or a failure such as an
API server outage longer than the retries), kopf stops the others. After a
failure that stop can hang (watchers wait for credentials that the stopped
credentials task will never bring), leaving a process with no watchers and a
refused /healthz. So the process exits as soon as the reactor is gone: at
once with kopf's result when the stop ends within ``STOP_GRACE_S``, else
hard with status 1. Kubernetes (the chart) or the demo then restarts it.
"""

from __future__ import annotations

import asyncio
import getpass
import importlib
import logging
import os
import socket

import kopf

STOP_GRACE_S = 30.0
log = logging.getLogger("metainfer.operator")


def run(namespaces: list[str] | None, liveness: str | None, standalone: bool, verbose: bool) -> int:
    handlers = importlib.import_module("metainfer.operator.handlers")
    from metainfer.operator import kopf_readiness
    from metainfer.operator import namespaces as watched

    kopf_readiness.install()

    watched.WATCHED_PATTERNS[:] = namespaces or []
    kopf.configure(verbose=verbose)
    if services_watch_allowed(namespaces or []):
        handlers.watch_services()
    if not verbose:
        logging.getLogger("kopf.objects").addFilter(quiet_wakeups)
    return asyncio.run(_operate(namespaces, liveness, standalone))


# The handlers that only wake a policy's daemon run on every event of every Node, run and child: kopf's INFO line
# for each ("Handler 'on_child' succeeded.") was most of the log and 3 % of the operator's CPU at 1,000 nodes x
# 100 policies, and says nothing the daemon's own lines do not. Their failures are still logged.
WAKEUP_HANDLERS = ("on_node", "on_run", "on_child")
_QUIET = frozenset(f"Handler '{name}' succeeded." for name in WAKEUP_HANDLERS)


def services_watch_allowed(namespaces: list[str]) -> bool:
    """Ask once, before kopf starts, whether the Services watch can run (capabilities.py says why it is optional).
    An API server that cannot be asked leaves it off: the operator then works as it does without the grant."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    from metainfer.operator.capabilities import can_watch, self_subject_access
    from metainfer.operator.startup import load_client_config

    try:
        load_client_config()
        allowed = can_watch("services", namespaces, self_subject_access)
    except (ApiException, ConfigException, HTTPError, OSError) as exc:
        log.warning("could not ask the API server whether services may be watched (%s); not watching them", exc)
        return False
    if not allowed:
        log.info("services: no list and watch granted; every reconcile creates the Services it plans (409 if present)")
    return allowed


def quiet_wakeups(record: logging.LogRecord) -> bool:
    return record.getMessage() not in _QUIET


def peering_identity() -> str | None:
    """kopf's own identity unless it would crash: a UID without a passwd entry (the image's 65532,
    OpenShift's arbitrary UIDs) makes getpass.getuser() raise, so the pod's name stands in."""
    if os.environ.get("POD_ID"):
        return None  # kopf reads it itself (the chart sets it from metadata.name)
    try:
        getpass.getuser()
        return None
    except (KeyError, OSError):
        return f"uid-{os.getuid()}@{socket.gethostname()}/{os.getpid()}"


async def _operate(namespaces: list[str] | None, liveness: str | None, standalone: bool) -> int:
    existing = asyncio.all_tasks()
    root_tasks = await kopf.spawn_tasks(
        identity=peering_identity(),  # type: ignore[arg-type]  # kopf.Identity is a NewType of str
        clusterwide=not namespaces,
        namespaces=namespaces or [],
        liveness_endpoint=liveness,
        standalone=standalone,
    )
    runner = asyncio.create_task(kopf.run_tasks(root_tasks, ignored=existing))
    await asyncio.wait(root_tasks, return_when=asyncio.FIRST_COMPLETED)
    done, _ = await asyncio.wait({runner}, timeout=STOP_GRACE_S)
    if runner not in done:
        log.error("the operator's reactor stopped and did not finish within %gs; exiting to be restarted", STOP_GRACE_S)
        logging.shutdown()
        os._exit(1)  # hung tasks and threads would keep asyncio.run() from returning
    if runner.cancelled() or runner.exception() is not None:
        log.error("the operator's reactor stopped: %r; exiting to be restarted", runner.exception())
        return 1
    return 0
