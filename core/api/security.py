"""Kubernetes' securityContext of a Pod and of a container, as pydantic models, and metainfer's hardened defaults.

The operator's settings (core.control.settings) hold one of each for its adaptation Jobs and one for its serving
pods; a platform team replaces them through the Helm values, which arrive in the Kubernetes spelling these models
validate (camelCase, unknown keys refused), so a typo fails the operator's startup instead of every pod.

The defaults run pods hardened: non-root, read-only root filesystem, no privilege escalation, no capabilities,
RuntimeDefault seccomp. Unset fields stay unset in the manifests: where a platform assigns each pod a UID from the
namespace's range (OpenShift's restricted SCC), a pinned one gets the pod refused.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from metainfer.core.api._base import ApiModel

UID = 65532  # "nonroot" in distroless images
# The range the API server accepts for UIDs and GIDs in a security context.
Id = Annotated[int, Field(ge=0, le=2**31 - 1)]


class _Frozen(ApiModel):
    model_config = ConfigDict(frozen=True)


class SeccompProfile(_Frozen):
    type: Literal["RuntimeDefault", "Localhost", "Unconfined"]
    localhost_profile: str | None = None


class AppArmorProfile(_Frozen):
    type: Literal["RuntimeDefault", "Localhost", "Unconfined"]
    localhost_profile: str | None = None


class SELinuxOptions(_Frozen):
    user: str | None = None
    role: str | None = None
    type: str | None = None
    level: str | None = None


class WindowsOptions(_Frozen):
    gmsa_credential_spec_name: str | None = None
    gmsa_credential_spec: str | None = None
    run_as_user_name: str | None = None
    host_process: bool | None = None


class Capabilities(_Frozen):
    add: tuple[str, ...] | None = None
    drop: tuple[str, ...] | None = None


class Sysctl(_Frozen):
    name: str = Field(min_length=1)
    value: str


class _IdentityContext(_Frozen):
    """Fields a Pod's and a container's securityContext share. Unset stays unset in the manifest: where a platform
    assigns UIDs itself (OpenShift's restricted SCC), a pinned one gets the pod refused."""

    run_as_user: Id | None = None
    run_as_group: Id | None = None
    run_as_non_root: bool | None = None
    seccomp_profile: SeccompProfile | None = None
    app_armor_profile: AppArmorProfile | None = None
    se_linux_options: SELinuxOptions | None = None
    windows_options: WindowsOptions | None = None

    @model_validator(mode="after")
    def _can_start(self) -> _IdentityContext:
        # The API server stores this pod, the kubelet then refuses to start it, forever: say so at startup instead.
        if self.run_as_non_root and self.run_as_user == 0:
            raise ValueError("runAsNonRoot with runAsUser 0 can never start")
        return self


class PodSecurityContext(_IdentityContext):
    """A Pod's securityContext, as Kubernetes spells it (camelCase, unknown keys refused)."""

    fs_group: Id | None = None
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = None
    supplemental_groups: tuple[Id, ...] | None = None
    supplemental_groups_policy: Literal["Merge", "Strict"] | None = None
    se_linux_change_policy: Literal["MountOption", "Recursive"] | None = None
    sysctls: tuple[Sysctl, ...] | None = None


class ContainerSecurityContext(_IdentityContext):
    """A container's securityContext, as Kubernetes spells it (camelCase, unknown keys refused)."""

    allow_privilege_escalation: bool | None = None
    privileged: bool | None = None
    read_only_root_filesystem: bool | None = None
    capabilities: Capabilities | None = None
    proc_mount: Literal["Default", "Unmasked"] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ContainerSecurityContext:
        # The API server refuses this combination in every pod the operator would create.
        if self.privileged and self.allow_privilege_escalation is False:
            raise ValueError("privileged: true needs allowPrivilegeEscalation to be true or unset")
        return self


RUNTIME_DEFAULT = SeccompProfile(type="RuntimeDefault")
DEFAULT_POD_SECURITY_CONTEXT = PodSecurityContext(
    run_as_non_root=True, run_as_user=UID, run_as_group=UID, fs_group=UID, seccomp_profile=RUNTIME_DEFAULT
)
# No UID here: the pod's says it once, so a platform that assigns UIDs clears a single place.
DEFAULT_CONTAINER_SECURITY_CONTEXT = ContainerSecurityContext(
    run_as_non_root=True,
    read_only_root_filesystem=True,
    allow_privilege_escalation=False,
    privileged=False,
    capabilities=Capabilities(drop=("ALL",)),
    seccomp_profile=RUNTIME_DEFAULT,
)
