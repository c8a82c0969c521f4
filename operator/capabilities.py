"""What the operator's own RBAC lets it watch, asked of the API server before kopf starts.

The Services watch is an optimisation (one that exists is not created again on every reconcile; one deleted is
created again at once), not a need: an operator image also runs under an older chart's ClusterRole, which grants
create, patch and delete on services but not list and watch. kopf retries a forbidden watch for ever and never
reports ready, so the watch is registered only where every namespace the operator serves allows it; elsewhere the
operator creates the Services it plans and takes the API server's 409 for those that exist, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

GLOB_CHARACTERS = frozenset("*?")

# (verb, resource, namespace or "" for the cluster scope) -> allowed
AccessCheck = Callable[[str, str, str], bool]


def scopes_to_check(namespace_patterns: Sequence[str]) -> list[str] | None:
    """The namespaces whose permission decides (``""``: the cluster scope), or None when they cannot be named:
    a glob pattern matches namespaces that may not exist yet, and each would need its own grant."""
    if not namespace_patterns:
        return [""]
    # kopf's syntax: comma-separated globs, "!" excluding (namespaces.match_namespace).
    names = {part.strip() for pattern in namespace_patterns for part in pattern.split(",")} - {""}
    if not names or any(GLOB_CHARACTERS & set(name) or name.startswith("!") for name in names):
        return None
    return sorted(names)


def can_watch(resource: str, namespace_patterns: Sequence[str], allowed: AccessCheck) -> bool:
    """Whether the operator may list and watch ``resource`` wherever it serves policies."""
    scopes = scopes_to_check(namespace_patterns)
    if scopes is None:
        return False
    return all(allowed(verb, resource, scope) for scope in scopes for verb in ("list", "watch"))


def self_subject_access(verb: str, resource: str, namespace: str) -> bool:
    """Ask the API server (a SelfSubjectAccessReview, which every authenticated user may create) whether this
    process's credentials may ``verb`` the core group's ``resource`` in ``namespace`` ("": cluster scope)."""
    from kubernetes import client

    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                group="", resource=resource, verb=verb, namespace=namespace or None
            )
        )
    )
    answer = client.AuthorizationV1Api().create_self_subject_access_review(review, _request_timeout=30)
    return bool(answer.status and answer.status.allowed)
