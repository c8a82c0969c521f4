"""kopf settings, set once at startup.

- Storage keys and the finalizer carry the ``metainfer.io`` prefix, so they
  never collide with another kopf operator on the same objects.
- API requests retry for ``api_retry_seconds`` (ten minutes by default):
  kopf's own backoffs give up after under a minute, and a keep-alive that
  gives up kills kopf's reactor (see ``main``: the process then exits).
- Watches time out on both sides: kopf's watch streams can otherwise freeze
  silently behind a load balancer that drops idle connections.
- Peering: replicas share one peering object; each takes a distinct priority
  from its start time, and the newest wins: exactly one acts, older replicas
  pause (kopf stops their daemons) and resume when it is gone. Newest, not
  oldest, because a SIGKILLed replica's keep-alive lingers for the peering
  lifetime: with oldest-wins its restart would sit paused behind its own ghost.
  Equal priorities would both act, so ties are made practically impossible.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from typing import Any

import kopf

from metainfer.core.api.names import FINALIZER, KOPF_PREFIX
from metainfer.operator import metrics
from metainfer.operator.config import ConfigError, OperatorConfig
from metainfer.operator.diffbase import LeanAnnotationsDiffBaseStorage, changing_handlers_registered


class ApiRetryBackoffs:
    """kopf's backoffs growing to 30 s, repeated until ``budget_s`` is spent; re-iterable, as kopf iterates the
    setting afresh for every request."""

    RAMP = (1.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0)
    CEILING = 30.0

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s

    def __iter__(self) -> Iterator[float]:
        spent = 0.0
        for delay in itertools.chain(self.RAMP, itertools.repeat(self.CEILING)):
            if spent + delay > self.budget_s:
                return
            spent += delay
            yield delay


def start_priority(now: float | None = None) -> int:
    """Start time in microseconds: the newest replica has the highest priority."""
    return int((now if now is not None else time.time()) * 1_000_000)


def configure(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = LeanAnnotationsDiffBaseStorage(
        prefix=KOPF_PREFIX,
        key="last-handled-configuration",
        changing_handlers=changing_handlers_registered(kopf.get_default_registry()),
    )
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    settings.networking.error_backoffs = ApiRetryBackoffs(config.api_retry_seconds)
    settings.peering.name = config.peering_name
    settings.peering.clusterwide = True
    settings.peering.priority = start_priority()
    # Only warnings become Events by themselves: the reconcile posts its own (coalesced) Events, and kopf posting
    # every INFO log line ("created run ...") as an Event too doubled the operator's writes.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "metainfer-operator"


def load_client_config() -> None:
    """The kubernetes client used for writes: in-cluster credentials, else the kubeconfig."""
    from kubernetes import config as kube_config

    try:
        kube_config.load_incluster_config()
    except kube_config.ConfigException:
        kube_config.load_kube_config()


def ensure_peering_object(name: str, logger: kopf.Logger) -> None:
    """Create the ClusterKopfPeering object replicas share; kopf does not create it itself."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    body = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}}
    try:
        client.CustomObjectsApi().create_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", body)
        logger.info("created ClusterKopfPeering %s", name)
    except ApiException as exc:
        if exc.status != 409:
            raise


@kopf.on.startup()
def on_startup(settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
    try:
        config = OperatorConfig()
    except ConfigError as exc:  # no retry fixes a bad value: stop, naming the variable (the pod's log says it)
        raise kopf.PermanentError(str(exc)) from exc
    configure(settings, config)
    load_client_config()
    ensure_peering_object(config.peering_name, logger)
    metrics.serve(config.metrics_port)
    logger.info("metainfer operator configured: %s", config.model_dump(mode="json"))
