"""`metainfer check-install`: what `helm test` runs in the release's test pod.

Two questions a platform team asks after an install or upgrade, answered from the cluster: is the operator's
Deployment rolled out and available, and does the API server admit an AdaptationPolicy in a workload namespace
(the CRD is served with its schema, and no admission policy refuses it)? The policy is created with
``dryRun=All``: nothing is stored, nothing is reconciled.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from metainfer.agent.job_api import REQUEST_TIMEOUT_S, KubeError, api_client
from metainfer.core.api.names import GROUP, POLICY_PLURAL, VERSION
from metainfer.core.api.policy import AdaptationPolicy, AdaptationPolicySpec, ModelSource, Slo

PROBE_POLICY = "metainfer-install-check"
_MESSAGE_LIMIT = 400


@dataclass(frozen=True)
class Finding:
    ok: bool
    what: str
    detail: str

    def line(self) -> str:
        return f"{'ok' if self.ok else 'FAIL'}: {self.what}: {self.detail}"


def probe_policy(namespace: str) -> dict[str, object]:
    """A valid policy built from the API types (so the check follows the schema as it changes)."""
    spec = AdaptationPolicySpec(
        model=ModelSource(uri="https://models.invalid/install-check.onnx", sha256="0" * 64),
        slo=Slo(latency_p95_ms=100),
    )
    policy = AdaptationPolicy(metadata={"name": PROBE_POLICY, "namespace": namespace}, spec=spec)
    return policy.model_dump(mode="json", by_alias=True, exclude_none=True)


def _reason(exc: ApiException) -> str:
    body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body or exc.reason)
    return f"HTTP {exc.status}: {body[:_MESSAGE_LIMIT]}"


def check_operator(api: client.ApiClient, namespace: str, name: str) -> Finding:
    what = f"operator Deployment {namespace}/{name}"
    try:
        deployment = client.AppsV1Api(api).read_namespaced_deployment(
            name, namespace, _request_timeout=REQUEST_TIMEOUT_S
        )
    except ApiException as exc:
        return Finding(False, what, _reason(exc))
    return rollout_finding(what, deployment)


def rollout_finding(what: str, deployment: client.V1Deployment) -> Finding:
    """Rolled out: the controller saw the latest spec, and every wanted replica is updated and available."""
    wanted = deployment.spec.replicas if deployment.spec.replicas is not None else 1
    status = deployment.status or client.V1DeploymentStatus()
    available = status.available_replicas or 0
    updated = status.updated_replicas or 0
    detail = f"{available}/{wanted} available, {updated}/{wanted} updated"
    if wanted == 0:
        return Finding(False, what, "scaled to 0 replicas: no operator reconciles policies")
    generation = (deployment.metadata.generation if deployment.metadata else None) or 0
    if (status.observed_generation or 0) < generation:
        return Finding(False, what, f"its controller has not observed the latest spec yet ({detail})")
    return Finding(available >= wanted and updated >= wanted, what, detail)


def check_policy_admitted(api: client.ApiClient, namespace: str) -> Finding:
    what = f"a dry-run AdaptationPolicy in {namespace}"
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, POLICY_PLURAL, probe_policy(namespace),
            dry_run="All", _request_timeout=REQUEST_TIMEOUT_S,
        )  # fmt: skip
    except ApiException as exc:
        return Finding(False, what, f"refused: {_reason(exc)}")
    return Finding(True, what, "admitted (nothing stored)")


def check_install_command(deployment: str, policy_namespaces: list[str], kubeconfig: str | None) -> int:
    namespace, _, name = deployment.partition("/")
    if not namespace or not name:
        print(f"metainfer: error: --deployment {deployment!r}: expected NAMESPACE/NAME", file=sys.stderr)
        return 2
    try:
        api = api_client(kubeconfig)
    except KubeError as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    with api:
        findings = [check_operator(api, namespace, name)]
        findings += [check_policy_admitted(api, ns) for ns in policy_namespaces]
    for finding in findings:
        print(finding.line(), flush=True)
    return 0 if all(f.ok for f in findings) else 1
