"""Base class and schema helpers shared by the CRD types.

Python code uses snake_case; the JSON the API server stores uses camelCase
(Kubernetes convention), through aliases. ``extra="forbid"`` makes a typo in a
manifest an error in Python too, mirroring the server's strict field validation.

``rules``/``immutable`` attach CEL ``x-kubernetes-validations`` to a field or a
model's JSON schema; core/api/crdgen.py copies them into the CRD unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict
from pydantic.alias_generators import to_camel

XValidations = list[dict[str, str]]
TRUNCATED = " …[truncated]"


def bounded(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, with a visible mark where it was cut."""
    if len(text) <= limit:
        return text
    return text[: max(limit - len(TRUNCATED), 0)] + TRUNCATED[:limit]


def one_line(value: object, limit: int) -> str:
    """A string from elsewhere (a pod's status, an event) as one line of at most ``limit`` characters."""
    return bounded(" ".join(str(value or "").split()), limit)


def _bound_to(limit: int) -> BeforeValidator:
    return BeforeValidator(lambda value: bounded(value, limit) if isinstance(value, str) else value)


# Status text copied from somewhere else (a run's condition, an exception, a server's reply) is cut to fit
# where it lands instead of failing validation: one overlong message must never wedge a whole status write.
# Pair with ``Field(max_length=N)`` of the same N, which keeps the CRD schema's maxLength.
StatusText64 = Annotated[str, _bound_to(64)]
StatusText256 = Annotated[str, _bound_to(256)]
StatusText1024 = Annotated[str, _bound_to(1024)]
StatusText4096 = Annotated[str, _bound_to(4096)]
StatusText32768 = Annotated[str, _bound_to(32768)]


class ApiModel(BaseModel):
    """A Kubernetes-facing object: camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_api(self) -> dict[str, Any]:
        """The JSON form the API server stores (aliases, no unset optionals)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def rule(expression: str, message: str, *, field_path: str | None = None, reason: str | None = None) -> dict[str, str]:
    """One CEL validation rule; ``field_path`` makes the error name the offending field."""
    out = {"rule": expression, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    return out


def rules(*items: dict[str, str]) -> dict[str, Any]:
    """``json_schema_extra`` carrying CEL rules."""
    return {"x-kubernetes-validations": list(items)}


def cel(*items: dict[str, str]) -> ConfigDict:
    """A model_config carrying CEL rules on the model's own schema (cross-field rules)."""
    return ConfigDict(json_schema_extra=rules(*items))


def immutable(what: str) -> dict[str, str]:
    """A transition rule: once set, the value may not change."""
    return rule("self == oldSelf", f"{what} is immutable")


def set_list() -> dict[str, Any]:
    """A list of unique scalars (``x-kubernetes-list-type: set``): duplicates are rejected."""
    return {"x-kubernetes-list-type": "set"}


def map_list(*keys: str) -> dict[str, Any]:
    """A list of objects keyed by ``keys`` (server-side apply merges by key; duplicates rejected)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}
