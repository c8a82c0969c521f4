"""The fields the control layer reads from AdaptationPolicies and AdaptationRuns, read in one place.

The operator validates a policy and that policy's own runs into core.api's models where they come in
(``parse_runs``); everything below plans on those models. A run that does not validate becomes an
``InvalidRun`` (its name, its class if readable, and why), so one bad object costs its own class a
decision, never the policy its reconcile. ``metadata`` stays a plain mapping in the models (Kubernetes
owns its schema), so the accessors here are its only readers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from metainfer.core.api.conditions import ConditionType, Reason
from metainfer.core.api.policy import AdaptationPolicy
from metainfer.core.api.run import AdaptationRun
from metainfer.core.api.vocabulary import RunPhase

ApiObject = AdaptationPolicy | AdaptationRun
MAX_ERROR = 512  # an invalid run's message ends up in a ClassStatus message and an Event: keep it bounded


def as_policy(policy: AdaptationPolicy | Mapping[str, Any]) -> AdaptationPolicy:
    return policy if isinstance(policy, AdaptationPolicy) else AdaptationPolicy.model_validate(policy)


def as_run(run: AdaptationRun | Mapping[str, Any]) -> AdaptationRun:
    return run if isinstance(run, AdaptationRun) else AdaptationRun.model_validate(run)


# --- metadata ------------------------------------------------------------------------------------------------------


def name_of(obj: ApiObject) -> str:
    return _text(obj.metadata.get("name")) or ""


def namespace_of(obj: ApiObject) -> str:
    return _text(obj.metadata.get("namespace")) or "default"


def uid_of(obj: ApiObject) -> str:
    return _text(obj.metadata.get("uid")) or ""


def generation_of(obj: ApiObject) -> int:
    generation = obj.metadata.get("generation", 0)
    return generation if isinstance(generation, int) else int(str(generation))


def created_of(obj: ApiObject) -> str:
    """creationTimestamp as stored: RFC 3339 in UTC, so it orders as text."""
    return str(obj.metadata.get("creationTimestamp", ""))


def label_of(obj: ApiObject, key: str) -> str | None:
    return _entry(obj.metadata.get("labels"), key)


def annotation_of(obj: ApiObject, key: str) -> str | None:
    return _entry(obj.metadata.get("annotations"), key)


def _entry(mapping: object, key: str) -> str | None:
    return _text(mapping.get(key)) if isinstance(mapping, Mapping) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


# --- runs ----------------------------------------------------------------------------------------------------------


def run_phase(run: AdaptationRun) -> RunPhase:
    """status.phase if set, else derived from the Succeeded condition."""
    status = run.status
    if status is None:
        return _phase(None, None, started=False)
    succeeded = next((c for c in status.conditions if c.type == ConditionType.SUCCEEDED), None)
    return _phase(
        status.phase, succeeded.status if succeeded else None, started=bool(status.job_name or status.start_time)
    )


def run_phase_from_body(body: Mapping[str, Any]) -> RunPhase:
    """``run_phase`` of an unvalidated body: the cluster-wide in-flight index reads every run's phase on every
    event, and validating each one there would cost what ``parse_runs`` saves."""
    status = body.get("status") or {}
    conditions = status.get("conditions") or []
    succeeded = next((c for c in conditions if c.get("type") == ConditionType.SUCCEEDED), None)
    return _phase(
        status.get("phase"),
        str(succeeded.get("status") or "") if succeeded is not None else None,
        started=bool(status.get("jobName") or status.get("startTime")),
    )


def _phase(recorded: object, succeeded: str | None, *, started: bool) -> RunPhase:
    """``succeeded``: the status of the run's Succeeded condition, None without one."""
    if recorded in RunPhase.__members__.values():
        return RunPhase(str(recorded))
    if succeeded is None:
        return RunPhase.RUNNING if started else RunPhase.PENDING
    return {"True": RunPhase.SUCCEEDED, "False": RunPhase.FAILED}.get(succeeded, RunPhase.RUNNING)


def run_failure(run: AdaptationRun) -> tuple[str, str]:
    """(reason, message) of a failed run, from its Succeeded condition."""
    conditions = run.status.conditions if run.status else []
    cond = next((c for c in conditions if c.type == ConditionType.SUCCEEDED), None)
    if cond is not None and cond.status == "False":
        return cond.reason or Reason.JOB_FAILED, cond.message or ""
    return Reason.JOB_FAILED, "the run failed without a reason"


def recipe_key(run: AdaptationRun) -> str:
    """The key of the run's best recipe: as the agent recorded it, else computed from the recipe."""
    status = run.status
    if status is None:
        return ""
    if status.best_recipe_key:
        return status.best_recipe_key
    return status.best_recipe.key() if status.best_recipe is not None else ""


def variant_key(run: AdaptationRun) -> str:
    """What a serving pod serves: the recipe key and the model it was found for (``<recipe key>-<sha256[:8]>``).

    Two runs with one recipe on two model versions serve different variants: a canary must tell them apart, in
    the rollout decision and in the serving metrics' ``variant`` label.
    """
    key = recipe_key(run)
    return f"{key}-{run.spec.model_sha256[:8]}" if key else ""


def latest(runs: Sequence[AdaptationRun]) -> AdaptationRun | None:
    """The most recently created run (creationTimestamp, then name: deterministic on ties)."""
    return max(runs, key=lambda r: (created_of(r), name_of(r)), default=None)


# --- validation at the edge ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InvalidRun:
    """A run of the policy whose body does not validate: planned around, and reported."""

    name: str
    class_fingerprint: str | None  # spec.classFingerprint where it is at least a string
    error: str  # the first validation error, the field named

    @property
    def message(self) -> str:
        return f"run {self.name}: {self.error}"


@dataclass(frozen=True)
class ParsedRuns:
    valid: tuple[AdaptationRun, ...]
    invalid: tuple[InvalidRun, ...]


def parse_runs(bodies: Iterable[Mapping[str, Any]]) -> ParsedRuns:
    """One policy's runs as models; the ones that do not validate set aside with the reason."""
    valid: list[AdaptationRun] = []
    invalid: list[InvalidRun] = []
    for body in bodies:
        try:
            valid.append(AdaptationRun.model_validate(body))
        except ValidationError as exc:
            meta, spec = body.get("metadata"), body.get("spec")
            name = _entry(meta, "name") or "?"
            invalid.append(InvalidRun(name, _entry(spec, "classFingerprint"), validation_message(exc)[:MAX_ERROR]))
    return ParsedRuns(tuple(valid), tuple(invalid))


def validation_message(exc: ValidationError) -> str:
    """The first error as ``field.path: what is wrong`` (the path as the API spells it: camelCase)."""
    first = exc.errors()[0]
    return ".".join(str(part) for part in first["loc"]) + f": {first['msg']}"
