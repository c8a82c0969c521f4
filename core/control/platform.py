"""What the platform lets a policy ask for, beyond what its author could create herself.

The operator creates Jobs and Deployments with its own rights; a user who may
only create AdaptationPolicies must not get, through it, pods she could not
create: a hostPath mount of any node directory, or any image. The platform team
lists what policies may use (Helm ``policies.allowedHostPaths`` and
``policies.allowedImages``); the default allows no hostPath and no image but
the operator's own.

Scheduling is the platform's too: a priority class can preempt other teams'
pods, a runtime class picks the sandbox pods run in, and a toleration lets pods
onto nodes a taint reserves (admission plugins such as PodTolerationRestriction
would stop her own pods; the operator's pods would pass them in its name). So
``spec.scheduling`` names only classes in ``policies.allowedPriorityClasses``
and ``policies.allowedRuntimeClasses`` (none by default), and
``spec.hardware.tolerations`` only keys in ``policies.allowedTolerationKeys``
(any by default, as before this list existed; ``*`` means any, and a toleration
without a key, which tolerates every taint, needs ``*``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

from metainfer.core.api.policy import AdaptationPolicySpec

ANY = "*"


@dataclass(frozen=True)
class PlatformLimits:
    """Allow-lists: host directories (a path allows itself and what is below it) and image prefixes."""

    allowed_host_paths: Sequence[str] = ()
    allowed_images: Sequence[str] = ()
    default_image: str = ""
    allowed_priority_classes: Sequence[str] = ()
    allowed_runtime_classes: Sequence[str] = ()
    allowed_toleration_keys: Sequence[str] = (ANY,)


class ForbiddenByPlatform(ValueError):
    """The policy asks for something the platform does not allow; the message names the field."""


def _under(path: str, root: str) -> bool:
    root = posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def platform_violations(spec: AdaptationPolicySpec, limits: PlatformLimits) -> list[str]:
    """Each field of ``spec`` the platform does not allow, with what it does allow."""
    out: list[str] = []
    volume = spec.model.volume
    if volume is not None and volume.host_path is not None:
        # normpath folds "/models/../etc" into "/etc": the path compared is the one the kubelet mounts.
        path = posixpath.normpath(volume.host_path)
        if not any(_under(path, root) for root in limits.allowed_host_paths):
            allowed = ", ".join(limits.allowed_host_paths) or "none"
            out.append(
                f"spec.model.volume.hostPath {volume.host_path!r} is not allowed by the platform "
                f"(policies.allowedHostPaths: {allowed}); use a PersistentVolumeClaim (claimName)"
            )
    image = spec.serving.image
    if (
        image is not None
        and image != limits.default_image
        and not any(image.startswith(p) for p in limits.allowed_images)
    ):
        allowed = ", ".join(limits.allowed_images) or "only the operator's own image"
        out.append(f"spec.serving.image {image!r} is not allowed by the platform (policies.allowedImages: {allowed})")
    out += _scheduling_violations(spec, limits)
    return out


def _scheduling_violations(spec: AdaptationPolicySpec, limits: PlatformLimits) -> list[str]:
    out: list[str] = []
    named = (
        ("priorityClassName", spec.scheduling.priority_class_name, limits.allowed_priority_classes, "Priority"),
        ("runtimeClassName", spec.scheduling.runtime_class_name, limits.allowed_runtime_classes, "Runtime"),
    )
    for field, value, allowed, kind in named:
        if value is not None and value not in allowed:
            listed = ", ".join(allowed) or "none"
            out.append(
                f"spec.scheduling.{field} {value!r} is not allowed by the platform "
                f"(policies.allowed{kind}Classes: {listed})"
            )
    if ANY in limits.allowed_toleration_keys:
        return out
    keys = ", ".join(limits.allowed_toleration_keys) or "none"
    for i, toleration in enumerate(spec.hardware.tolerations or []):
        if toleration.key is None or toleration.key not in limits.allowed_toleration_keys:
            what = repr(toleration.key) if toleration.key is not None else "without a key (tolerates every taint)"
            out.append(
                f"spec.hardware.tolerations[{i}] {what} is not allowed by the platform "
                f"(policies.allowedTolerationKeys: {keys})"
            )
    return out


def check_platform_limits(spec: AdaptationPolicySpec, limits: PlatformLimits) -> None:
    """Raise ForbiddenByPlatform naming every field the platform does not allow."""
    violations = platform_violations(spec, limits)
    if violations:
        raise ForbiddenByPlatform("; ".join(violations))
