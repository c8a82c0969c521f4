"""AdaptationRun: one adaptation of one policy's model to one hardware class.

The spec is the run's key plus a snapshot of the policy settings the agent
needs, and it is immutable as a whole: a run is a record, and a different
adaptation is a different run (with a deterministic name derived from the key,
so a restarted operator finds it instead of creating a second one).

The status is bounded (at most ``MAX_TRIALS`` trial summaries) so a long search
never pushes the object towards etcd's size limit. ``bestRecipe`` embeds core's
Recipe with its own snake_case keys: those keys are what Recipe.key() hashes.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import Field, StringConstraints

from metainfer.core.api._base import (
    ApiModel,
    StatusText64,
    StatusText256,
    StatusText1024,
    StatusText4096,
    cel,
    immutable,
    map_list,
    rule,
)
from metainfer.core.api.conditions import Condition
from metainfer.core.api.hardwareclass import DESCRIPTION_MAX, FINGERPRINT_PATTERN, HardwareClass
from metainfer.core.api.names import API_VERSION, RUN_KIND, ApiVersion, RunKind
from metainfer.core.api.policy import (
    SHA256_PATTERN,
    ModelSource,
    ObjectiveWeights,
    PolicyScheduling,
    SearchSettings,
    SearchSpaceOverrides,
    Slo,
    VariantStore,
)
from metainfer.core.api.vocabulary import RunPhase, RunTrigger, TrialState
from metainfer.core.engine.recipe import Recipe

MAX_TRIALS = 50
MAX_HISTORY_SOURCES = 6  # earlier runs one run learns from: the closest few carry nearly all the signal


class AdaptationRunSpec(ApiModel):
    """The key of the run (policy, class, model, batch, reason) and the settings it runs with."""

    model_config = cel(
        immutable("spec"),
        rule(
            "self.modelSha256 == self.model.sha256",
            "modelSha256 must equal model.sha256",
            field_path=".modelSha256",
        ),
        rule("self.batchSize == self.slo.batchSize", "batchSize must equal slo.batchSize", field_path=".batchSize"),
    )

    policy_name: str = Field(min_length=1, max_length=253, description="The owning AdaptationPolicy.")
    policy_generation: int = Field(ge=0, description="The policy's metadata.generation the run was made from.")
    class_fingerprint: str = Field(pattern=FINGERPRINT_PATTERN, description="HardwareClass.fingerprint().")
    hardware_class: HardwareClass
    class_description: str | None = Field(
        None, max_length=DESCRIPTION_MAX, description="hardwareClass in words (HardwareClass.description())."
    )
    model_sha256: str = Field(pattern=SHA256_PATTERN, description="Equal to model.sha256 (part of the key).")
    batch_size: int = Field(ge=1, le=4096, description="Equal to slo.batchSize (part of the key).")
    reason: RunTrigger = Field(description="Why this run exists.")
    model: ModelSource
    slo: Slo
    objective: ObjectiveWeights = Field(default_factory=ObjectiveWeights)
    search_space: SearchSpaceOverrides = Field(default_factory=SearchSpaceOverrides)
    search: SearchSettings = Field(default_factory=SearchSettings)
    variant_store: VariantStore | None = Field(
        None, description="The policy's serving.variantStore when the run was made: where the Job keeps the variant."
    )
    runtime: str | None = Field(
        None,
        max_length=256,
        description="The ONNX Runtime build of the image the run's Job runs (distribution, version, execution "
        "providers); part of the run key.",
    )
    image: str | None = Field(
        None,
        max_length=512,
        description="The image the run's Job runs: it serves the variant while the platform's "
        "image has another runtime.",
    )
    scheduling: PolicyScheduling | None = Field(
        None, description="The policy's spec.scheduling when the run was made: how its Job is scheduled."
    )
    serving_memory_limit_mib: int | None = Field(
        None,
        ge=1,
        alias="servingMemoryLimitMiB",
        description="The memory limit of the class's serving container when the run was made (the policy's "
        "serving.resources, else the platform's serving defaults), MiB: the search keeps every candidate "
        "below what it leaves a variant (less serve's own floor and its data plane's buffers), beside"
        " slo.maxMemoryMiB. The policy's own limit is part of the run key.",
    )
    history_from: list[Annotated[str, StringConstraints(min_length=1, max_length=253)]] = Field(
        default_factory=list,
        max_length=MAX_HISTORY_SOURCES,
        description="Finished runs of the same policy (this class's earlier ones, then other classes') whose measured"
        " trials warm-start this run's search; the agent ranks them by how alike their hardware and model are.",
    )


class RunProgress(ApiModel):
    trials_completed: int = Field(0, ge=0)
    trial_budget: int | None = Field(None, ge=0)
    feasible_trials: int = Field(0, ge=0)
    elapsed_seconds: float = Field(0.0, ge=0)
    stage: StatusText64 | None = Field(None, max_length=64, description="Profiling, Searching, Validating...")


class RunMetrics(ApiModel):
    """Measured metrics of a variant, in API units."""

    p50_ms: float | None = Field(None, ge=0)
    p95_ms: float = Field(ge=0)
    p99_ms: float | None = Field(None, ge=0)
    throughput_per_s: float | None = Field(None, ge=0, description="Samples per second.")
    quality_metric: StatusText64 | None = Field(None, max_length=64)
    quality_drop: float | None = None
    peak_memory_mib: float | None = Field(
        None, ge=0, alias="peakMemoryMiB", description="Peak resident memory of the process serving the variant, MiB."
    )
    model_size_mib: float | None = Field(None, ge=0, alias="modelSizeMiB")


class TrialSummary(ApiModel):
    index: int = Field(ge=0)
    recipe_key: str = Field(max_length=64)
    description: StatusText256 | None = Field(None, max_length=256)
    status: TrialState
    p95_ms: float | None = Field(None, ge=0)
    quality_drop: float | None = None
    score: float | None = None
    error: StatusText1024 | None = Field(None, max_length=1024)


CHECKPOINT_MAX_CHARS = 1_000_000  # base64 text: the run object must stay well under etcd's 1.5 MiB request limit


class SearchCheckpoint(ApiModel):
    """The search so far, so that a retried Job (agent killed, node drained) continues without re-measuring."""

    trials: int = Field(ge=0, description="Measured trials in data.")
    search_seconds: float = Field(ge=0, description="Search time spent so far (counts against timeBudgetSeconds).")
    data: str = Field(
        max_length=CHECKPOINT_MAX_CHARS,
        pattern=r"^[A-Za-z0-9+/=]*$",
        description="gzip + base64 of the trials as JSON (core Trial): points, recipes, measurements.",
    )


class HistorySourceSummary(ApiModel):
    run: str = Field(max_length=253)
    class_description: StatusText256 | None = Field(None, max_length=256)
    similarity: float = Field(ge=0, le=1, description="How alike its hardware profile and model are to this run's.")
    trials: int = Field(ge=0, description="Its measured trials the search was given.")


class RunHistory(ApiModel):
    """What the run's search took from earlier runs (spec.historyFrom)."""

    sources: list[HistorySourceSummary] = Field(default_factory=list, max_length=MAX_HISTORY_SOURCES)
    from_classes: StatusText256 | None = Field(
        None, max_length=256, description="The source classes in words, for kubectl get -o wide."
    )
    trials_saved: int = Field(
        0, ge=0, description="Measurements the history spared: points not measured again, and failures not re-tried."
    )
    note: StatusText256 | None = Field(None, max_length=256)


class AdaptationRunStatus(ApiModel):
    observed_generation: int | None = Field(None, ge=0)
    conditions: list[Condition] = Field(default_factory=list, max_length=16, json_schema_extra=map_list("type"))
    phase: RunPhase | None = Field(
        None, description="Coarse summary for kubectl; conditions carry the detail and the reason."
    )
    job_name: str | None = Field(None, max_length=253)
    log_tail: StatusText4096 | None = Field(
        None,
        max_length=4096,
        description="The last lines the run's pod logged, kept when its Job failed without a result (an OOM kill, "
        "the deadline): the pod goes with the Job's TTL.",
    )
    hardware_profile_name: str | None = Field(None, max_length=253)
    start_time: dt.datetime | None = None
    completion_time: dt.datetime | None = None
    progress: RunProgress | None = None
    trials: list[TrialSummary] = Field(
        default_factory=list,
        max_length=MAX_TRIALS,
        description=f"The best {MAX_TRIALS} trials (bounded).",
        json_schema_extra=map_list("index"),
    )
    best_recipe: Recipe | None = Field(None, description="core Recipe of the best feasible variant.")
    best_recipe_key: str | None = Field(None, max_length=64)
    best_variant_sha256: str | None = Field(
        None,
        pattern=SHA256_PATTERN,
        description="sha256 of the best variant's ONNX bytes as validated: serving pods load or rebuild exactly it.",
    )
    best_metrics: RunMetrics | None = None
    checkpoint: SearchCheckpoint | None = Field(
        None, description="While searching: what a retried Job resumes from. Removed when the run ends."
    )
    trial_history: SearchCheckpoint | None = Field(
        None,
        description="When the run has ended: its measured trials, with its model's and hardware's features, for later"
        " runs of the policy to warm-start from (garbage-collected with the run).",
    )
    history: RunHistory | None = None


class AdaptationRun(ApiModel):
    # Literal types (core.api.names says why): an object of another API version or kind fails validation.
    api_version: ApiVersion = API_VERSION
    kind: RunKind = RUN_KIND
    metadata: dict[str, object] = Field(default_factory=dict)
    spec: AdaptationRunSpec
    status: AdaptationRunStatus | None = None
