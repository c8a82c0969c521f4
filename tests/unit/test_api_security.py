"""The security contexts a platform sets for the operator's pods (core.api.security) refuse what Kubernetes would
refuse or could never start (a typo, a root UID under runAsNonRoot, privileges with no escalation), so a bad Helm
value fails the operator's startup instead of every pod it creates."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from metainfer.core.api.security import ContainerSecurityContext, PodSecurityContext


@pytest.mark.parametrize(
    ("model", "value", "why"),
    [
        (PodSecurityContext, {"runAsUsr": 1000}, "runAsUsr"),  # a typo is an error, not a silent default
        (PodSecurityContext, {"runAsUser": -1}, "runAsUser"),
        (PodSecurityContext, {"runAsNonRoot": True, "runAsUser": 0}, "can never start"),
        (PodSecurityContext, {"seccompProfile": {"type": "Default"}}, "seccompProfile"),
        (ContainerSecurityContext, {"privileged": True, "allowPrivilegeEscalation": False}, "allowPrivilegeEscalation"),
        (ContainerSecurityContext, {"capabilities": {"drop": "ALL"}}, "drop"),
    ],
)
def test_security_contexts_refuse_what_kubernetes_would(model: type, value: dict[str, Any], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        model.model_validate(value)
