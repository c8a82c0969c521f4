"""What the trial history did for one run: the account its report and its run status give.

Split from ``core.engine.history`` so that the report (``core.engine.report``)
can carry it while the history reads reports back: history imports the report,
the report imports only this. The bounds (``MAX_SOURCES``, ``FIRST_WINNERS``)
are the history's, shared here because the account is bounded by them too.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

MAX_SOURCES = 8
FIRST_WINNERS = 2  # winners of the most similar related sources measured first

Short = Annotated[str, StringConstraints(max_length=64)]
Scalar = str | int | float | bool | None


class Plain(BaseModel):
    """The history's models: frozen, and nothing beyond their fields (they travel through the API server)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Similarity(Plain):
    total: float = Field(ge=0, le=1)
    hardware: float = Field(ge=0, le=1)
    model: float = Field(ge=0, le=1)
    spec: float = Field(ge=0, le=1)


class SourceUse(Plain):
    label: Annotated[str, StringConstraints(max_length=256)]
    model_sha256: Short
    hardware_fingerprint: Short
    batch: int
    similarity: Similarity
    trials: int = Field(ge=0, description="Its trials that shaped the prior.")
    winner: dict[str, Scalar] | None = None


class HistoryUse(Plain):
    """What the history did for a run: the report's (and the run status's) account of it."""

    offered: int = Field(0, ge=0, description="Sources offered.")
    sources: list[SourceUse] = Field(default_factory=list, max_length=MAX_SOURCES)
    ignored: list[Annotated[str, StringConstraints(max_length=300)]] = Field(default_factory=list, max_length=32)
    warm: bool = Field(False, description="A source was related enough to start from its winner.")
    trials_used: int = Field(0, ge=0, description="History trials that shaped the search's prior.")
    first_points: list[dict[str, Scalar]] = Field(default_factory=list, max_length=FIRST_WINNERS)
    skipped_known_failures: int = Field(0, ge=0, description="Points not measured: they failed on matching hardware.")
    best_found_at: int | None = Field(None, description="1-based trial that first measured the search's best.")
    trials_saved: int = Field(
        0,
        ge=0,
        description="Trials of the budget left unmeasured because the warm-started search converged early.",
    )
