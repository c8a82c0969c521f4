"""AdaptationPolicy: what a model owner asks for, in one object.

Every field a person can get wrong is bounded here (enums, ranges, patterns),
and cross-field rules are CEL, so ``kubectl apply`` rejects a bad policy with
the field named instead of the operator failing later. Defaults are chosen so
that a policy with only ``model`` and ``slo.latencyP95Ms`` is complete.

Nothing in the spec is immutable on purpose: changing the model sha256, the
batch size or the selection is how a user asks for a re-adaptation.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, StringConstraints, create_model, field_validator, model_validator

from metainfer.core.api._base import (
    ApiModel,
    StatusText64,
    StatusText256,
    StatusText1024,
    StatusText4096,
    cel,
    map_list,
    rule,
    set_list,
)
from metainfer.core.api.conditions import Condition
from metainfer.core.api.hardwareclass import FINGERPRINT_PATTERN, AcceleratorVendor, HardwareClass
from metainfer.core.api.k8s_syntax import (
    DNS1123_SUBDOMAIN,
    IMAGE,
    LABEL_KEY,
    LABEL_VALUE,
    RESERVED_MOUNT_PATHS,
    RESERVED_MOUNT_PREFIX,
    is_reserved_mount_path,
    parse_quantity,
)
from metainfer.core.api.names import API_VERSION, POLICY_KIND, ApiVersion, PolicyKind
from metainfer.core.api.vocabulary import ClassState, RolloutPhase
from metainfer.core.engine.algorithms import DEFAULT_ALGORITHM, MAX_TRIAL_BUDGET, Algorithm
from metainfer.core.engine.knobs import KNOBS, Knob, UpTo, check_knobs, overridable
from metainfer.core.engine.quality_choice import CHOICE_PATTERN
from metainfer.core.engine.scoring import (
    DEFAULT_LATENCY_WEIGHT,
    DEFAULT_MEMORY_WEIGHT,
    DEFAULT_QUALITY_WEIGHT,
    DEFAULT_THROUGHPUT_WEIGHT,
)

SHA256_PATTERN = r"^[a-f0-9]{64}$"
# No '@' before the path: credentials in a URI cannot work here and would be copied into status and logs.
MODEL_URI_PATTERN = r"^(https?|file|configmap|s3|gs|az|hf)://([^\s/@]+(/[^\s]*)?|/[^\s]+)$"
URI_SCHEMES_TEXT = (
    "http(s)://, s3://BUCKET/KEY, gs://BUCKET/KEY, az://CONTAINER/BLOB, hf://ORG/REPO[@REVISION]/FILE, file:// (a"
    " mounted volume) or configmap://NAME/KEY"
)
TensorType = Literal["float32", "float16", "int64", "int32", "int8", "uint8", "bool"]
Quantity = Annotated[int | str, Field(description="A Kubernetes quantity, e.g. 500m, 2, 4Gi.")]


class InputSpec(ApiModel):
    """One model input, when the model's own metadata should be overridden."""

    name: str = Field(min_length=1, max_length=253, description="Input name as in the ONNX graph.")
    shape: list[Annotated[int, Field(ge=-1)]] | None = Field(
        None, max_length=16, description="Dimensions; -1 for a dynamic axis (the batch axis usually)."
    )
    dtype: TensorType | None = Field(None, description="Element type, when it cannot be read from the model.")


class DataReference(ApiModel):
    """Samples for calibration (static int8) and quality validation: an NPZ named after the inputs."""

    uri: str = Field(
        max_length=2048,
        pattern=MODEL_URI_PATTERN,
        description=f"Where the .npz lives: {URI_SCHEMES_TEXT}; read with the model's credentials.",
    )
    sha256: str | None = Field(None, pattern=SHA256_PATTERN, description="Expected sha256 of the file.")
    calibration_samples: int = Field(100, ge=1, le=100000, description="Samples used to calibrate int8.")
    validation_samples: int = Field(500, ge=1, le=1000000, description="Samples used to measure quality.")


def _cel_string(text: str) -> str:
    """``text`` as a single-quoted CEL string literal (a regex's backslashes doubled)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


_RESERVED_MOUNTS = ", ".join(_cel_string(p) for p in RESERVED_MOUNT_PATHS)


class ModelVolume(ApiModel):
    """A volume mounted read-only into adaptation Jobs and serving pods; file:// URIs point into it."""

    model_config = cel(
        rule(
            "has(self.claimName) != has(self.hostPath)",
            "exactly one of claimName or hostPath must be set",
        ),
        rule(
            f"!(self.mountPath in [{_RESERVED_MOUNTS}]) && self.mountPath != '{RESERVED_MOUNT_PREFIX}'"
            f" && !self.mountPath.startsWith('{RESERVED_MOUNT_PREFIX}/')",
            f"mountPath must not be {', '.join(RESERVED_MOUNT_PATHS)} or under {RESERVED_MOUNT_PREFIX}: "
            "the pod uses them itself",
            field_path=".mountPath",
        ),
    )

    claim_name: str | None = Field(
        None, min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN, description="A PersistentVolumeClaim."
    )
    host_path: str | None = Field(
        None, max_length=4096, pattern=r"^/", description="A directory on the node (absolute path)."
    )
    mount_path: str = Field("/models", max_length=4096, pattern=r"^/[^:]*$", description="Where it is mounted.")

    @field_validator("mount_path")
    @classmethod
    def _not_a_path_the_pod_uses(cls, value: str) -> str:
        if is_reserved_mount_path(value):
            raise ValueError(f"must not be {', '.join(RESERVED_MOUNT_PATHS)} or under {RESERVED_MOUNT_PREFIX}")
        return value


class StoreCredentials(ApiModel):
    """Where the agent and serving pods find the model store's credentials: a Secret, mounted read-only.

    Naming a Secret is admitted only from someone who may read it (the chart's ValidatingAdmissionPolicy asks the
    authorizer), so a policy cannot borrow credentials its author could not read herself."""

    secret_name: str = Field(
        min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN, description="A Secret in the policy's namespace."
    )


class ModelSource(ApiModel):
    """The base ONNX model. The sha256 pins it: a variant is rebuilt from (sha256, recipe)."""

    uri: str = Field(
        max_length=2048,
        pattern=MODEL_URI_PATTERN,
        description=f"{URI_SCHEMES_TEXT} (same namespace, binaryData; small models only). No user:password@:"
        " credentials would show in status; name a Secret in credentials instead.",
    )
    sha256: str = Field(pattern=SHA256_PATTERN, description="Lower-case hex sha256 of the model file.")
    version: str | None = Field(None, max_length=128, description="Free-form model version, for people.")
    inputs: list[InputSpec] | None = Field(
        None, max_length=64, description="Input names/shapes, if the model's metadata is not enough."
    )
    data: DataReference | None = Field(
        None, description="Calibration/validation samples; without them quality is measured on random inputs."
    )
    volume: ModelVolume | None = Field(None, description="Volume holding file:// models and data.")
    credentials: StoreCredentials | None = Field(
        None,
        description="A Secret of the policy's namespace with what the model's and data's store needs: keys, token,"
        " endpoint, CA bundle (docs/model-stores.md). Without it, object stores are read anonymously (or with the"
        " workload identity the platform enabled).",
    )


class DecoderSlo(ApiModel):
    """A decoder language model's workload and SLOs (a model with past key values, detected from its graph): a
    prompt prefilled, then tokens decoded one at a time with the KV cache. For such a model the serving latency
    series are per output token, so canaries and drift judge time per output token."""

    time_to_first_token_p95_ms: float | None = Field(
        None, gt=0, le=600000, alias="timeToFirstTokenP95Ms", description="p95 time to first token of the prompt."
    )
    time_per_output_token_p95_ms: float | None = Field(
        None, gt=0, le=600000, alias="timePerOutputTokenP95Ms", description="p95 time per output token."
    )
    min_tokens_per_second: float | None = Field(
        None, gt=0, le=1e7, description="Decode tokens per second of one stream, at least."
    )
    max_perplexity_rise: float = Field(
        0.03, ge=0, le=10, description="Perplexity on the reference text over FP32's, as a fraction (0.03 = +3 %)."
    )
    prompt_tokens: int = Field(128, ge=1, le=131072, description="Prompt length of the measured workload.")
    decode_tokens: int = Field(64, ge=1, le=131072, description="Tokens decoded per measured generation.")
    concurrency: int = Field(4, ge=1, le=256, description="Streams decoding together for the aggregate tokens/s.")
    max_context: int | None = Field(
        None, ge=2, le=1048576, description="Context the KV cache is sized for (default: the model's, else 2048)."
    )


class Slo(ApiModel):
    """Hard constraints: a variant that misses any of them is never rolled out."""

    model_config = cel(
        rule(
            "!has(self.latencyP99Ms) || (has(self.latencyP95Ms) && self.latencyP99Ms >= self.latencyP95Ms)",
            "latencyP99Ms must be >= latencyP95Ms",
            field_path=".latencyP99Ms",
        ),
        rule(
            "has(self.latencyP95Ms) || has(self.decoder)",
            "latencyP95Ms is required (or, for a decoder language model, decoder)",
            field_path=".latencyP95Ms",
            reason="FieldValueRequired",
        ),
    )

    latency_p95_ms: float | None = Field(
        None, gt=0, le=600000, description="p95 latency per batch, milliseconds (required unless decoder is set)."
    )
    latency_p99_ms: float | None = Field(
        None,
        gt=0,
        le=600000,
        description="Optional p99 bound per batch, ms: candidates over it are infeasible, and a production p99 "
        "over it counts as drift.",
    )
    max_quality_drop: float = Field(
        0.01, ge=0, le=1, description="Largest accepted drop of the quality metric vs FP32 (0.01 = 1 point)."
    )
    quality_metric: str = Field(
        "auto",
        max_length=72,
        pattern=CHOICE_PATTERN,
        description="The metric maxQualityDrop is written in. auto: top-1 accuracy when the data has labels, the"
        " share of samples whose every step keeps FP32's argmax when an output is a distribution over classes at"
        " each step (CTC text recognition, tagging), 1 - the relative L2 error when every output is one number per"
        " sample (a regression, a binary probability: a per-sample cosine would see only its sign), else cosine"
        " similarity. argmax_agreement asks for the per-step share on any class scores (tagging logits);"
        " relative_l2_similarity for any float outputs (box regressions, whose scale a cosine misses);"
        " plugin:<name> names a metric the platform installed in the image (Python entry point group"
        " metainfer.quality_metrics).",
    )
    max_memory_mib: int | None = Field(
        None, ge=1, alias="maxMemoryMiB", description="Peak memory budget of the serving process, MiB."
    )
    batch_size: int = Field(1, ge=1, le=4096, description="Batch size in production; variants are tuned for it.")
    decoder: DecoderSlo | None = Field(
        None, description="For a decoder language model: its workload and its SLOs in tokens (see DecoderSlo)."
    )

    @property
    def serving_p95_ms(self) -> float:
        """The bound on the serving latency series: per batch, or for a decoder per output token (infinite where
        the policy sets none: drift then compares with the adapted baseline only)."""
        if self.latency_p95_ms is not None:
            return self.latency_p95_ms
        bound = self.decoder.time_per_output_token_p95_ms if self.decoder is not None else None
        return bound if bound is not None else math.inf

    @model_validator(mode="after")
    def _a_latency_bound(self) -> Slo:
        if self.latency_p95_ms is None and self.decoder is None:
            raise ValueError("latencyP95Ms is required (or, for a decoder language model, decoder)")
        if self.latency_p99_ms is not None and (
            self.latency_p95_ms is None or self.latency_p99_ms < self.latency_p95_ms
        ):
            raise ValueError("latencyP99Ms must be >= latencyP95Ms")
        return self


class ObjectiveWeights(ApiModel):
    """Feasible variants are ranked by this weighted score of terms relative to FP32 (timing noise = a tie)."""

    model_config = cel(
        rule(
            "self.latency + self.throughput + self.memory + self.quality > 0.0",
            "at least one objective weight must be positive",
        )
    )

    latency: float = Field(
        DEFAULT_LATENCY_WEIGHT,
        ge=0,
        le=100,
        description="Weight of low latency: FP32's median latency per batch over the variant's.",
    )
    throughput: float = Field(
        DEFAULT_THROUGHPUT_WEIGHT, ge=0, le=100, description="Weight of high throughput: items/s over FP32's."
    )
    memory: float = Field(
        DEFAULT_MEMORY_WEIGHT, ge=0, le=100, description="Weight of low peak memory: FP32's peak over the variant's."
    )
    quality: float = Field(
        DEFAULT_QUALITY_WEIGHT, ge=0, le=100, description="Weight of high quality: the variant's metric over FP32's."
    )

    @model_validator(mode="after")
    def _some_weight_positive(self) -> ObjectiveWeights:
        # The CEL rule above, for objects that reach the operator without the API server's validation.
        if self.latency + self.throughput + self.memory + self.quality <= 0:
            raise ValueError("at least one objective weight must be positive")
        return self


class Toleration(ApiModel):
    """Lets adaptation Jobs and serving pods run on tainted (e.g. GPU) nodes, as in a Pod spec."""

    # The rules a Pod's tolerations obey, so that a Job or Deployment built from them is never rejected.
    model_config = cel(
        rule("has(self.key) || self.operator == 'Exists'", "a toleration without key needs operator Exists"),
        rule(
            "self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "value must be empty when operator is Exists",
            field_path=".value",
        ),
        rule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "tolerationSeconds needs effect NoExecute",
            field_path=".tolerationSeconds",
        ),
    )

    key: str | None = Field(None, max_length=316, pattern=LABEL_KEY)
    operator: Literal["Exists", "Equal"] = Field("Equal")
    value: str | None = Field(None, max_length=63, pattern=LABEL_VALUE)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _as_a_pod_allows(self) -> Toleration:
        # The CEL rules above, for tolerations that reach the operator without the API server's validation (the
        # platform's workloads.tolerations): a Pod with a bad one is refused, and so would every Job be.
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without key needs operator Exists")
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty when operator is Exists")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect NoExecute")
        return self


class HardwareSelection(ApiModel):
    """Which nodes' hardware classes are adapted to."""

    model_config = cel(
        rule(
            f"!has(self.nodeSelector) || self.nodeSelector.all(k, k.matches({_cel_string(LABEL_KEY)}))",
            "nodeSelector keys must be label keys ([prefix/]name, name <= 63 characters of [A-Za-z0-9-_.])",
            field_path=".nodeSelector",
        )
    )

    node_selector: dict[str, Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE)]] | None = Field(
        None, max_length=32, description="Only nodes with all these labels (like a Pod's nodeSelector)."
    )
    vendors: list[AcceleratorVendor] | None = Field(
        None,
        min_length=1,
        max_length=5,
        description="Allowed accelerator vendors (cpu = nodes without one); all when omitted.",
        json_schema_extra=set_list(),
    )
    max_classes: int = Field(16, ge=1, le=64, description="Upper bound on hardware classes adapted to.")
    tolerations: list[Toleration] | None = Field(
        None, max_length=16, description="Added to adaptation Jobs and serving pods (accelerator taints)."
    )

    @field_validator("node_selector")
    @classmethod
    def _label_keys(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        bad = [k for k in value or {} if not re.match(LABEL_KEY, k)]
        if bad:
            raise ValueError(f"not label keys: {', '.join(repr(k[:80]) for k in bad[:3])}")
        return value


def search_space_fields(knobs: Sequence[Knob] = KNOBS) -> dict[str, Any]:
    """pydantic field definitions of ``spec.search.searchSpace``: one optional field per knob a policy
    may restrict, in the knobs' declared positions (the CRD keeps that order)."""
    check_knobs(knobs)
    fields: dict[str, Any] = {}
    for _, override in overridable(knobs):
        if isinstance(override, UpTo):
            fields[override.field] = (
                int | None,
                Field(None, ge=0, le=override.maximum, description=override.description),
            )
        else:
            # The item type is the knob's, known only at run time: mypy cannot read it as a type.
            fields[override.field] = (
                list[override.item] | None,  # type: ignore[name-defined]  # a run-time type, see above
                Field(
                    None,
                    min_length=1,
                    max_length=override.max_items,
                    description=override.description,
                    json_schema_extra=set_list(),
                ),
            )
    return fields


def search_space_model(knobs: Sequence[Knob], name: str = "SearchSpaceOverrides") -> type[ApiModel]:
    """A model with the search-space restrictions of ``knobs`` (the real one: ``SearchSpaceOverrides``)."""
    return create_model(name, __base__=ApiModel, __module__=__name__, **search_space_fields(knobs))


if TYPE_CHECKING:
    _KnobRestrictions = ApiModel
else:
    _KnobRestrictions = search_space_model(KNOBS, "_KnobRestrictions")


class SearchSpaceOverrides(_KnobRestrictions):
    """Restrict the joint search space; each omitted dimension keeps the engine's defaults."""


class SearchSettings(ApiModel):
    """How candidates are searched, and the budget of one adaptation run."""

    model_config = cel(
        rule(
            "!has(self.activeDeadlineSeconds) || self.activeDeadlineSeconds >= self.timeBudgetSeconds",
            "activeDeadlineSeconds must be >= timeBudgetSeconds",
            field_path=".activeDeadlineSeconds",
        )
    )

    algorithm: Algorithm = Field(DEFAULT_ALGORITHM, description="hybrid = evolution (coarse) then bayes (fine).")
    trial_budget: int = Field(32, ge=1, le=MAX_TRIAL_BUDGET, description="Candidates measured on hardware, at most.")
    time_budget_seconds: int = Field(1800, ge=10, le=604800, description="Wall-clock budget of the search.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed: same seed and trials -> same proposals.")
    max_concurrent_runs: int = Field(2, ge=1, le=64, description="Adaptation runs of this policy at once.")
    backoff_limit: int = Field(2, ge=0, le=10, description="Retries of a failed adaptation Job.")
    active_deadline_seconds: int | None = Field(
        None, ge=10, le=604800, description="Hard deadline of the Job; default time budget + 10 minutes."
    )


class ResourceRequirements(ApiModel):
    """Container resources, as in a Pod spec."""

    # Quantities are checked here, not in the CRD: CEL over int-or-string map values exceeds the API server's
    # cost budget. A policy with a bad quantity gets an InvalidSpec condition naming it, and nothing is created.
    requests: dict[str, Quantity] | None = Field(None, max_length=16)
    limits: dict[str, Quantity] | None = Field(None, max_length=16)

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ResourceRequirements:
        # Comparing quantities needs their value: the CRD can check their syntax, this checks their order.
        amounts = {
            part: {name: parse_quantity(value) for name, value in (getattr(self, part) or {}).items()}
            for part in ("requests", "limits")
        }
        for name, limit in amounts["limits"].items():
            request = amounts["requests"].get(name)
            if request is not None and request > limit:
                raise ValueError(f"requests.{name} must not exceed limits.{name}")
        return self


class VariantStore(ApiModel):
    """Where adaptation Jobs keep the variants they built and validated, and serving pods load them from.

    Files are named by their sha256 (``sha256/<hex>.onnx``), which the run's status records, so a serving pod
    loads exactly the bytes the Job measured instead of rebuilding (re-quantizing) them at every start.
    """

    claim_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="A PersistentVolumeClaim in the policy's namespace: Jobs mount it read-write, serving pods"
        " read-only. ReadWriteMany, unless Jobs and serving pods share one node. The pods' UID (or fsGroup) must"
        " be able to write it.",
    )


class ServingSettings(ApiModel):
    """The Deployment that serves the best variant of each class."""

    replicas: int = Field(2, ge=1, le=1000, description="Stable replicas per hardware class.")
    image: str | None = Field(
        None, min_length=1, max_length=512, pattern=IMAGE, description="Serving image; defaults to the operator's."
    )
    resources: ResourceRequirements | None = Field(None, description="Resources of the serving container.")
    max_queue_delay_ms: float | None = Field(
        None,
        ge=0,
        le=1000,
        description="Dynamic batching: how long a lone request waits for others to share its run, ms (serve's"
        " --max-queue-delay-ms; its default when unset). Runs combine up to the adapted recipe's batch.",
    )
    batch_dependent: Literal["combine", "isolate"] | None = Field(
        None,
        description="A variant whose outputs depend on the other requests of its run (dynamic int8: one activation"
        " scale per run): 'combine' batches its requests (outputs vary within what validation measured and held to"
        " maxQualityDrop), 'isolate' runs each alone (the same request always gets the same outputs, less"
        " throughput). serve's --batch-dependent; 'combine' when unset.",
    )
    variant_store: VariantStore | None = Field(
        None,
        description="Keep each built variant in this volume, content-addressed, so serving pods start without"
        " rebuilding it. Applies to runs made after it is set; without it (or when a file is missing) serving pods"
        " rebuild the variant and check it is byte-identical to the one the run validated.",
    )


class RolloutSettings(ApiModel):
    """Canary rollout: a new variant must prove itself against the stable one."""

    canary_replicas: int = Field(
        1, ge=0, le=1000, description="Canary replicas; 0 promotes without analysis. Ignored with canaryWeightPercent."
    )
    canary_weight_percent: int | None = Field(
        None,
        ge=1,
        le=99,
        description="Share of requests for the canary, in percent. The Service spreads requests evenly over ready "
        "pods, so this sets the canary's replicas: round(replicas x w / (100 - w)), at least 1; the share served is "
        "reported in status.classes[].rollout.",
    )

    def canary_replicas_for(self, stable_replicas: int) -> int:
        """The canary Deployment's replicas: from the weight when one is set, else canaryReplicas."""
        if self.canary_weight_percent is None:
            return self.canary_replicas
        weight = self.canary_weight_percent
        return max(1, round(stable_replicas * weight / (100 - weight)))

    analysis_window_seconds: int = Field(300, ge=30, le=86400, description="How long the canary is observed.")
    tolerance: float = Field(
        0.1, ge=0, le=10, description="Accepted relative p95 increase of the canary vs stable (0.1 = 10%)."
    )
    max_error_rate: float = Field(0.01, ge=0, le=1, description="Accepted canary error ratio.")
    deadline_seconds: int = Field(3600, ge=60, le=604800, description="A rollout not decided by then rolls back.")


class ReadaptationSettings(ApiModel):
    """Re-adapt when production latency drifts (measured by Prometheus), with hysteresis."""

    enabled: bool = Field(True, description="Watch production latency and re-adapt on drift.")
    drift_tolerance: float = Field(
        0.2, ge=0, le=10, description="Relative p95 excess over the SLO or the adapted baseline that counts."
    )
    consecutive_breaches: int = Field(3, ge=1, le=100, description="Breaches in a row that confirm drift.")
    cooldown_seconds: int = Field(1800, ge=0, le=604800, description="No re-adaptation this soon after one.")
    check_interval_seconds: int = Field(60, ge=5, le=86400, description="Period of the drift check.")
    window_seconds: int = Field(300, ge=10, le=86400, description="PromQL range of the p95 query.")
    prometheus_url: str | None = Field(
        None,
        alias="prometheusURL",
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description="Another Prometheus for this policy; honoured only if the platform allows it "
        "(Helm prometheus.allowedURLs), else metrics are unavailable with reason PrometheusNotAllowed.",
    )
    query: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="PromQL override returning one p95 in seconds; {policy}, {namespace}, {class} and "
        "{window} are substituted.",
    )


class VariantPin(ApiModel):
    """One adapted variant to serve, as it is, whatever drift, hardware churn or new runs say."""

    model_config = cel(
        rule("has(self.runName) != has(self.variantSha256)", "set exactly one of runName and variantSha256")
    )

    run_name: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="A succeeded AdaptationRun of this policy: its class serves that run's variant.",
    )
    variant_sha256: str | None = Field(
        None,
        pattern=SHA256_PATTERN,
        description="A variant's sha256 (a run's status.bestVariantSha256): every class with a succeeded run that"
        " validated it serves it.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> VariantPin:
        if (self.run_name is None) == (self.variant_sha256 is None):
            raise ValueError("set exactly one of runName and variantSha256")
        return self

    def describe(self) -> str:
        return f"run {self.run_name}" if self.run_name else f"variant sha256 {(self.variant_sha256 or '')[:16]}"


class PolicyScheduling(ApiModel):
    """How the policy's adaptation Jobs and serving pods are scheduled, beside the platform's own ``workloads.*``
    settings (which they replace where both name one). Each name must be in the platform's allow-list (Helm
    ``policies.allowedPriorityClasses``, ``policies.allowedRuntimeClasses``; none by default): a priority class can
    preempt other teams' pods, and a runtime class chooses the sandbox pods run in."""

    priority_class_name: str | None = Field(
        None,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="PriorityClass of the policy's Jobs and serving pods (in policies.allowedPriorityClasses).",
    )
    runtime_class_name: str | None = Field(
        None,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="RuntimeClass of the policy's Jobs and serving pods (in policies.allowedRuntimeClasses).",
    )


class AdaptationPolicySpec(ApiModel):
    """Adapt one ONNX model to every matching hardware class, and keep it adapted."""

    model_config = cel(
        rule(
            "has(self.rollout.canaryWeightPercent) || self.rollout.canaryReplicas < self.serving.replicas",
            "rollout.canaryReplicas must be less than serving.replicas",
            field_path=".rollout.canaryReplicas",
        )
    )

    model: ModelSource
    slo: Slo
    objective: ObjectiveWeights = Field(default_factory=ObjectiveWeights)
    hardware: HardwareSelection = Field(default_factory=HardwareSelection)
    search_space: SearchSpaceOverrides = Field(default_factory=SearchSpaceOverrides)
    search: SearchSettings = Field(default_factory=SearchSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    readaptation: ReadaptationSettings = Field(default_factory=ReadaptationSettings)
    scheduling: PolicyScheduling = Field(default_factory=PolicyScheduling)
    suspend: bool = Field(
        False,
        description="Hold the loop: no new runs, Jobs, rollouts, canary decisions or re-adaptations while true;"
        " what serves keeps serving as it is, and runs already running finish. Set back to false to resume.",
    )
    pin: VariantPin | None = Field(
        None,
        description="Serve this variant in every class that has it, directly (no canary), and start no run there:"
        " drift, driver changes and new model versions change nothing in those classes while the pin is set."
        " Classes without it adapt as usual. Remove it to resume.",
    )


class VariantSummary(ApiModel):
    """A served (or canary) variant: the recipe key and what it measured at adaptation."""

    recipe_key: str = Field(max_length=64, description="Recipe.key() of the variant.")
    variant: str | None = Field(
        None,
        max_length=64,
        description="The recipe key and the model's sha256 prefix: the serving metrics' variant label.",
    )
    description: StatusText256 | None = Field(None, max_length=256, description="Recipe.describe(): readable summary.")
    run_name: str | None = Field(None, max_length=253, description="The AdaptationRun that found it.")
    p95_ms: float | None = Field(None, ge=0, description="p95 measured at adaptation, ms.")
    quality_drop: float | None = Field(None, description="Quality drop vs FP32 measured at adaptation.")


class RolloutStatus(ApiModel):
    phase: RolloutPhase = Field(RolloutPhase.STABLE)
    canary: VariantSummary | None = None
    started_at: dt.datetime | None = None
    reason: StatusText1024 | None = Field(None, max_length=1024)
    message: StatusText4096 | None = Field(None, max_length=4096)


class DriftStatus(ApiModel):
    """Durable state of the drift detector (the operator keeps none in memory)."""

    consecutive_breaches: int = Field(0, ge=0)
    last_check_time: dt.datetime | None = None
    last_observed_p95_ms: float | None = Field(None, ge=0)
    last_observed_p99_ms: float | None = Field(None, ge=0, description="Checked only where slo.latencyP99Ms is set.")
    last_readaptation_time: dt.datetime | None = Field(
        None, description="Last confirmed drift; also salts the run key so a LatencyDrift run gets a new name."
    )
    baseline_p95_ms: float | None = Field(
        None, ge=0, description="First production p95 of the serving variant (raises the adaptation baseline)."
    )
    baseline_variant: str | None = Field(None, max_length=253, description="The run whose variant set the baseline.")
    reason: StatusText64 | None = Field(
        None,
        max_length=64,
        description="Outcome of the last check: WithinTolerance, LatencyBreach, Cooldown, "
        "LatencyDrift, or why metrics were unavailable (PrometheusUnreachable, PrometheusError, NoData).",
    )
    message: StatusText1024 | None = Field(None, max_length=1024, description="The last check, for people.")


class ClassStatus(ApiModel):
    """One hardware class selected by the policy."""

    fingerprint: str = Field(pattern=FINGERPRINT_PATTERN, description="HardwareClass.fingerprint().")
    name: str = Field(max_length=63, description="HardwareClass.name(), used in child object names.")
    hardware_class: HardwareClass | None = None
    nodes: int = Field(0, ge=0, description="Matching nodes now.")
    node_names: list[str] = Field(
        default_factory=list, max_length=64, description="Some of the matching nodes (at most 64)."
    )
    state: ClassState = Field(ClassState.PENDING)
    reason: StatusText1024 | None = Field(None, max_length=1024)
    message: StatusText4096 | None = Field(None, max_length=4096)
    current: VariantSummary | None = Field(None, description="The variant serving now.")
    run_name: str | None = Field(None, max_length=253, description="The latest AdaptationRun for this class.")
    deployment_name: str | None = Field(None, max_length=253)
    last_adaptation_time: dt.datetime | None = None
    last_adaptation_reason: StatusText64 | None = Field(None, max_length=64)
    rollout: RolloutStatus | None = None
    drift: DriftStatus | None = None


class UnclassifiedNode(ApiModel):
    """A node the policy would select whose labels form no hardware class (it gets no run)."""

    name: str = Field(max_length=253)
    reason: StatusText1024 = Field(max_length=1024, description="Which label, and what is wrong with it.")


MAX_UNCLASSIFIED_NODES = 16


class ExcludedNode(ApiModel):
    """A node the policy would select that its pods cannot be scheduled on (it forms no class, gets no run)."""

    name: str = Field(max_length=253)
    reason: StatusText1024 = Field(max_length=1024, description="Cordoned, or which taints are not tolerated.")


class AdaptationPolicyStatus(ApiModel):
    """Observed state; written by the operator only."""

    observed_generation: int | None = Field(None, ge=0, description="The generation last reconciled.")
    conditions: list[Condition] = Field(default_factory=list, max_length=16, json_schema_extra=map_list("type"))
    classes: list[ClassStatus] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra=map_list("fingerprint"),
    )
    class_count: int = Field(0, ge=0, description="Hardware classes selected.")
    ready_classes: int = Field(0, ge=0, description="Classes serving their best variant.")
    classes_summary: str | None = Field(None, max_length=32, description="ready/total, for kubectl get.")
    worst_class_p95_ms: float | None = Field(
        None,
        ge=0,
        description="The highest p95 among the variants the classes serve: the latency every class meets, ms.",
    )
    pinned: str | None = Field(None, max_length=300, description="spec.pin in words, while it is set.")
    endpoint: str | None = Field(
        None,
        max_length=320,
        description="The policy's stable in-cluster address (Service <policy> in the policy's namespace): every"
        " Ready serving pod of every class, REST on port 8080 and gRPC on 8081. It does not change with hardware"
        " classes, drivers or model versions.",
    )
    unclassified_nodes: list[UnclassifiedNode] = Field(
        default_factory=list,
        max_length=MAX_UNCLASSIFIED_NODES,
        description="Nodes this policy would select whose labels form no hardware class (the first 16 by name).",
        json_schema_extra=map_list("name"),
    )
    excluded_nodes: list[ExcludedNode] = Field(
        default_factory=list,
        max_length=MAX_UNCLASSIFIED_NODES,
        description="Nodes this policy would select that are cordoned or carry NoSchedule/NoExecute taints neither"
        " spec.hardware.tolerations nor the platform tolerates: they form no class (the first 16 by name).",
        json_schema_extra=map_list("name"),
    )


class AdaptationPolicy(ApiModel):
    """The whole object, for code that reads one from the API server."""

    # Literal types (core.api.names says why): an object of another API version or kind fails validation.
    api_version: ApiVersion = API_VERSION
    kind: PolicyKind = POLICY_KIND
    metadata: dict[str, object] = Field(default_factory=dict)
    spec: AdaptationPolicySpec
    status: AdaptationPolicyStatus | None = None
