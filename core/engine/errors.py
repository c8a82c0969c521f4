"""Errors that carry the field they are about and what was expected.

The CLI maps ``InputError`` to exit 2 and ``NoFeasibleCandidate`` to exit 3; the
agent maps each to a run condition reason. Nothing here knows about either.
"""

from __future__ import annotations


class MetainferError(Exception):
    """Base of every error metainfer raises on purpose."""

    reason: str = "Error"


class InputError(MetainferError):
    """Bad user input: a model, data file, flag or spec field.

    ``field`` names what was wrong (a flag, a file, an input name) so that the
    one-line message a user sees tells them where to look.
    """

    reason = "InvalidInput"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class ModelError(InputError):
    """The model file is missing, corrupt, not ONNX, or cannot be loaded."""

    reason = "InvalidModel"


class DataError(InputError):
    """Input data does not match the model's inputs."""

    reason = "InvalidData"


class UnsupportedModelError(MetainferError):
    """The model uses operators no available execution provider can run."""

    reason = "UnsupportedOperators"


class NoFeasibleCandidate(MetainferError):
    """Every evaluated candidate missed at least one hard constraint."""

    reason = "NoFeasibleCandidate"

    def __init__(self, message: str, closest: list[tuple[str, list[str]]]) -> None:
        # closest: (candidate description, constraints it missed), best first
        self.closest = closest
        super().__init__(message)
