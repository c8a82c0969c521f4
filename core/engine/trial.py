"""Measurements of one candidate on real hardware, and their outcome."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.engine.recipe import Recipe

# mean_pooled_cosine_similarity: sequence outputs of a model with an attention mask,
# compared after mask-weighted mean pooling (padding excluded), see reference.Reference.
# argmax_agreement: samples whose per-step argmax is FP32's at every step (core.engine.quality_metrics);
# relative_l2_similarity: 1 - the relative L2 error of the outputs over all samples (core.engine.reference).
# user_metric: a plugin the policy names (Quality.name).
QualityMetric = Literal[
    "top1_accuracy",
    "cosine_similarity",
    "mean_pooled_cosine_similarity",
    "argmax_agreement",
    "relative_l2_similarity",
    "user_metric",
]


# Outcome of one measured candidate (core.api.vocabulary re-exports it as TrialState).
class TrialStatus(StrEnum):
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    FAILED = "failed"


class LatencyStats(BaseModel):
    """Per-batch latency after warm-up, over ``runs`` timed runs."""

    model_config = ConfigDict(extra="forbid")

    p50_ms: float = Field(ge=0)
    p95_ms: float = Field(ge=0)
    p99_ms: float = Field(ge=0)
    mean_ms: float = Field(ge=0)
    runs: int = Field(ge=1)
    warmup_runs: int = Field(ge=0)
    throughput_per_s: float = Field(ge=0, description="Samples (not batches) per second at the median.")


class Quality(BaseModel):
    """Quality of a variant against the FP32 reference on the same samples."""

    model_config = ConfigDict(extra="forbid")

    metric: QualityMetric
    value: float = Field(
        description="Top-1 accuracy (0..1), mean cosine similarity (-1..1; an output with one value per sample, whose"
        " cosine is only its sign, counts as 1 - its relative L2 error), the fraction of samples whose every step"
        " keeps FP32's argmax (0..1), 1 - the relative L2 error over all samples (-1..1), or a plugin's value."
    )
    reference: float = Field(description="The FP32 model's value of the same metric.")
    drop: float = Field(description="reference - value: how much quality was lost.")
    samples: int = Field(ge=1)
    name: str | None = Field(None, max_length=64, description="The plugin's name, for metric user_metric.")


# Why a candidate's measurement stopped early: "raced" (clearly slower than the best so far after one timing
# round), "quality_screen" (clearly over the quality budget on the first samples). Its quality then covers
# only those samples (Quality.samples says how many).
EarlyStop = Literal["raced", "quality_screen"]


class TrialMetrics(BaseModel):
    model_config = ConfigDict(extra="forbid")

    latency: LatencyStats
    quality: Quality
    peak_memory_mib: float = Field(
        ge=0,
        description="Peak resident memory of the process with this variant: the floor before the first candidate "
        "plus the variant's own growth while loading and running.",
    )
    model_size_mib: float = Field(ge=0)
    variant_memory_mib: float | None = Field(
        None,
        ge=0,
        description="What the variant itself added to the process's resident memory while loading and running: the "
        "kernel's high-water mark above what the process held just before (None in reports written before it was "
        "measured). What a serving process needs beyond its own floor.",
    )
    early_stop: EarlyStop | None = Field(None, description="Why the measurement stopped early; None: measured in full.")


class Trial(BaseModel):
    """One evaluated (or failed) candidate."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0)
    point: dict[str, Any] = Field(description="The search-space point the recipe was made from.")
    recipe: Recipe
    status: TrialStatus
    metrics: TrialMetrics | None = None
    score: float | None = Field(None, description="Objective; None when infeasible or failed.")
    violations: list[str] = Field(default_factory=list, description="Hard constraints missed.")
    error: str | None = None
    predicted_score: float | None = Field(None, description="The surrogate's estimate before measuring.")
    wall_s: float = Field(0.0, ge=0)
