"""The API calls an adaptation Job makes, and which of their failures are worth a retry.

The agent Job talks to the API server for four things: read its run, patch
the run's status subresource, read a ConfigMap holding a small model, and
get/create/patch the cluster-scoped HardwareProfile of its class. Every call
carries a timeout, so an unreachable API server ends the attempt (and the Job
retries) instead of hanging until the Job's deadline. A serving pod reads a
configmap:// model through the same ``Kube``, and `metainfer check-install`
builds its client with ``api_client``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from metainfer.core.api.names import GROUP, PROFILE_PLURAL, RUN_PLURAL, VERSION

REQUEST_TIMEOUT_S = 30.0
MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    """An API call failed; ``transient`` says whether a later attempt can succeed."""

    def __init__(self, message: str, *, transient: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status


def api_client(kubeconfig: str | None) -> client.ApiClient:
    """``--kubeconfig`` if given, else in-cluster config, else the default kubeconfig (KUBECONFIG)."""
    try:
        # the config module is untyped: say what it returns
        if kubeconfig:
            from_file: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)
            return from_file
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except ConfigException:
            default: client.ApiClient = config.new_client_from_config()
            return default
    except (ConfigException, OSError) as exc:
        raise KubeError(f"no usable Kubernetes configuration: {exc}", transient=False) from exc


def wrap(exc: Exception, what: str) -> KubeError:
    """An API failure as a KubeError: 5xx, 429, 409 and connection errors are transient."""
    if isinstance(exc, ApiException):
        status = exc.status or 0
        transient = status >= 500 or status in (0, 409, 429)
        return KubeError(f"{what}: HTTP {status} {exc.reason}", transient=transient, status=status)
    return KubeError(f"{what}: {type(exc).__name__}: {exc}", transient=True)


@dataclass
class Kube:
    """Typed access to the objects the agent touches."""

    api: client.ApiClient

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def get_run(self, namespace: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = _call(
            f"reading AdaptationRun {namespace}/{name}",
            self.custom.get_namespaced_custom_object,
            GROUP, VERSION, namespace, RUN_PLURAL, name,
        )  # fmt: skip
        return result

    def patch_run_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch the status subresource: lists (conditions, trials) are replaced whole."""
        _call(
            f"writing the status of AdaptationRun {namespace}/{name}",
            self.custom.patch_namespaced_custom_object_status,
            GROUP, VERSION, namespace, RUN_PLURAL, name, {"status": status},
            _content_type=MERGE_PATCH,
        )  # fmt: skip

    def read_config_map(self, namespace: str, name: str) -> client.V1ConfigMap:
        result: client.V1ConfigMap = _call(
            f"reading ConfigMap {namespace}/{name}",
            client.CoreV1Api(self.api).read_namespaced_config_map,
            name, namespace,
        )  # fmt: skip
        return result

    def get_profile(self, name: str) -> dict[str, Any] | None:
        """The HardwareProfile ``name``, or None when there is none yet."""
        try:
            found: dict[str, Any] = _call(
                f"reading HardwareProfile {name}",
                self.custom.get_cluster_custom_object,
                GROUP, VERSION, PROFILE_PLURAL, name,
            )  # fmt: skip
            return found
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def create_profile(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create the profile object (spec only: status is a subresource); 409 is a KubeError with status 409."""
        result: dict[str, Any] = _call(
            f"creating HardwareProfile {body['metadata']['name']}",
            self.custom.create_cluster_custom_object,
            GROUP, VERSION, PROFILE_PLURAL, body,
        )  # fmt: skip
        return result

    def patch_profile_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = _call(
            f"writing the status of HardwareProfile {name}",
            self.custom.patch_cluster_custom_object_status,
            GROUP, VERSION, PROFILE_PLURAL, name, {"status": status},
            _content_type=MERGE_PATCH,
        )  # fmt: skip
        return result


def _call(what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """One API call with the request timeout; any failure is raised as a KubeError saying ``what`` failed."""
    try:
        return method(*args, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
    except Exception as exc:
        raise wrap(exc, what) from exc
