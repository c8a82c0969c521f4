"""Errors that carry the field they are about and what was expected.

The CLI maps ``InputError`` to exit 2 and ``NoFeasibleCandidate`` to exit 3; the
agent maps each to a run condition reason. Nothing here knows about either.
"""

from __future__ import annotations

from enum import StrEnum


class FailureReason(StrEnum):
    """Why the engine gave up; the agent writes it as the run's condition reason (core.api.vocabulary.Reason)."""

    ERROR = "Error"
    INVALID_INPUT = "InvalidInput"
    INVALID_MODEL = "InvalidModel"
    INVALID_DATA = "InvalidData"
    UNSUPPORTED_OPERATORS = "UnsupportedOperators"
    NO_FEASIBLE_CANDIDATE = "NoFeasibleCandidate"
    PROVIDER_UNAVAILABLE = "ExecutionProviderUnavailable"


class MetainferError(Exception):
    """Base of every error metainfer raises on purpose."""

    reason: FailureReason = FailureReason.ERROR


class InputError(MetainferError):
    """Bad user input: a model, data file, flag or spec field.

    ``field`` names what was wrong (a flag, a file, an input name) so that the
    one-line message a user sees tells them where to look.
    """

    reason = FailureReason.INVALID_INPUT

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class ModelError(InputError):
    """The model file is missing, corrupt, not ONNX, or cannot be loaded."""

    reason = FailureReason.INVALID_MODEL


class DataError(InputError):
    """Input data does not match the model's inputs."""

    reason = FailureReason.INVALID_DATA


class UnsupportedModelError(MetainferError):
    """The model uses operators no available execution provider can run."""

    reason = FailureReason.UNSUPPORTED_OPERATORS


# What ONNX Runtime says when a node has no kernel on any provider (an op or a type it lacks, a custom domain).
UNSUPPORTED_MARKERS = ("NOT_IMPLEMENTED", "Could not find an implementation", "is not a registered function/op")


def fp32_failure(exc: Exception) -> MetainferError:
    """The named error for ONNX Runtime failing to load or run the user's FP32 model: unsupported operators when it
    says so, otherwise an invalid model. Either way the run fails with ONNX Runtime's first line, not a traceback."""
    text = str(exc).strip()
    first = (text.splitlines()[0] if text else type(exc).__name__)[:500]
    if any(marker in text for marker in UNSUPPORTED_MARKERS):
        return UnsupportedModelError(f"the model uses an operator this ONNX Runtime cannot run: {first}")
    return ModelError("model", f"the FP32 model does not run on this machine: {first}")


class NoFeasibleCandidate(MetainferError):
    """Every evaluated candidate missed at least one hard constraint."""

    reason = FailureReason.NO_FEASIBLE_CANDIDATE

    def __init__(self, message: str, closest: list[tuple[str, list[str]]]) -> None:
        # closest: (candidate description, constraints it missed), best first
        self.closest = closest
        super().__init__(message)


class ProviderUnavailable(MetainferError):
    """An execution provider a recipe or a hardware class needs cannot run here: ONNX Runtime would have fallen
    back to the CPU without a word, and every latency measured would have been the CPU's."""

    reason = FailureReason.PROVIDER_UNAVAILABLE

    def __init__(self, provider: str, cause: str) -> None:
        self.provider = provider
        self.cause = cause
        super().__init__(f"{provider} is not usable here: {cause}")
