"""What the platform lets a policy ask for, beyond what its author could create herself.

The operator creates Jobs and Deployments with its own rights; a user who may
only create AdaptationPolicies must not get, through it, pods she could not
create: a hostPath mount of any node directory, or any image. The platform team
lists what policies may use (Helm ``policies.allowedHostPaths`` and
``policies.allowedImages``); the default allows no hostPath and no image but
the operator's own.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

from metainfer.core.api.policy import AdaptationPolicySpec


@dataclass(frozen=True)
class PlatformLimits:
    """Allow-lists: host directories (a path allows itself and what is below it) and image prefixes."""

    allowed_host_paths: Sequence[str] = ()
    allowed_images: Sequence[str] = ()
    default_image: str = ""


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
    return out


def check_platform_limits(spec: AdaptationPolicySpec, limits: PlatformLimits) -> None:
    """Raise ForbiddenByPlatform naming every field the platform does not allow."""
    violations = platform_violations(spec, limits)
    if violations:
        raise ForbiddenByPlatform("; ".join(violations))
