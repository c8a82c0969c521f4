"""Trial history that outlives a run, and how much of it applies to this one.

Most runs in a fleet are re-adaptations: a driver upgrade makes a class whose
landscape is nearly the old one, a new node type resembles an existing one, a
model update keeps most of its operators. Each of them used to search from
scratch. A ``TrialHistory`` carries what earlier runs measured, per *source*
(one model on one hardware class under one search-relevant spec): the model's
features (sha256, op mix, size), the hardware's (fingerprint, cores, peaks,
bandwidth, providers, the op support matrix), the batch and objective, and
every trial's search point with its outcome.

``similarity`` compares a source with this run from those features alone
(same sha256 / fingerprint = 1; otherwise op-mix cosine, size, peaks, cores,
providers, op support agreement...), ``rank`` orders sources by it, and
``warm_start`` turns the related ones into a ``search.Prior``: the surrogate's
mean, the most similar source's winner to re-measure first, and the points
that failed on hardware that agrees with this one on the ops that point needs.

The model is plain pydantic with every list, map and string bounded
(``MAX_SOURCES`` x ``MAX_TRIALS`` trials, about 0.5 KB each), so the operator
can keep it in the API server and hand it to the agent Job as JSON.
``load_reports`` reads ``metainfer adapt``'s report.json files into one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import Field, StringConstraints, ValidationError

from metainfer.core.engine.history_use import (
    FIRST_WINNERS,
    MAX_SOURCES,
    HistoryUse,
    Plain,
    Scalar,
    Short,
    Similarity,
    SourceUse,
)
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.profile.types import HardwareProfile, SupportStatus
from metainfer.core.engine.report import REPORT_FILE, AdaptSettings, Report
from metainfer.core.engine.scoring import Constraints, Objective
from metainfer.core.engine.search.prior import (
    Evidence,
    Prior,
    SearchContext,
    builtin_prior,
    key_in,
    project,
    warm_prior,
)
from metainfer.core.engine.search.space import Key, Space
from metainfer.core.engine.trial import Quality, TrialStatus

MAX_TRIALS = 64
MAX_OPS = 512
RELATED = 0.5  # similarity from which a source's winner is re-measured first and its failures are skipped
USEFUL = 0.2  # similarity below which a source is ignored

Name = Annotated[str, StringConstraints(max_length=128)]


class HistoryTrial(Plain):
    """One measured candidate: enough to replay it into a searcher."""

    point: dict[Short, Annotated[str, StringConstraints(max_length=64)] | int | float | bool | None] = Field(
        max_length=64, description="The search-space point (knob name -> choice)."
    )
    status: TrialStatus
    score: float | None = Field(None, description="The run's objective; None when infeasible or failed.")
    p50_ms: float | None = Field(None, ge=0)
    p95_ms: float | None = Field(None, ge=0)
    quality_drop: float | None = None
    quality_measure: str | None = Field(
        None,
        max_length=96,
        description="What the drop is a drop of (quality_measure()); None in histories kept before it was: their"
        " drops are never compared with this run's, whose metric may differ.",
    )
    failure: str | None = Field(None, max_length=200, description="The first violation or error.")


def quality_measure(quality: Quality) -> str:
    """A drop's unit: the metric, and a plugin's name (two plugins' drops are not comparable either)."""
    return f"{quality.metric}:{quality.name}" if quality.name else str(quality.metric)


class ModelFeatures(Plain):
    sha256: Short
    name: Name = ""
    size_bytes: int = Field(0, ge=0)
    parameters: int = Field(0, ge=0)
    op_counts: dict[Short, int] = Field(default_factory=dict, max_length=128)
    transformer: bool = False

    @classmethod
    def of(cls, model: ModelInfo) -> ModelFeatures:
        top = sorted(model.op_counts.items(), key=lambda kv: (-kv[1], kv[0]))[:128]
        return cls(
            sha256=model.sha256[:64],
            name=Path(model.path).parent.name[:128] or Path(model.path).name[:128],
            size_bytes=model.size_bytes,
            parameters=model.parameters,
            op_counts={k[:64]: v for k, v in top},
            transformer=model.is_transformer,
        )


class HardwareFeatures(Plain):
    fingerprint: Short
    cpu_model: Name = ""
    arch: Short = ""
    logical_cores: int = Field(1, ge=1)
    physical_cores: int = Field(1, ge=1)
    cpu_flags: list[Short] = Field(default_factory=list, max_length=64)
    execution_providers: list[Short] = Field(default_factory=list, max_length=32)
    peak_gemm_gflops_fp32: float = Field(0.0, ge=0)
    peak_gemm_gflops_int8: float = Field(0.0, ge=0)
    memory_bandwidth_gbps: float = Field(0.0, ge=0)
    ops: dict[Name, SupportStatus] = Field(
        default_factory=dict, max_length=MAX_OPS, description="op/dtype[/variant]@provider -> support status."
    )

    @classmethod
    def of(cls, profile: HardwareProfile) -> HardwareFeatures:
        m = profile.machine
        ops = {
            f"{o.op_type}/{o.dtype}{'/' + o.variant if o.variant else ''}@{o.provider}"[:128]: o.status
            for o in profile.ops
        }
        return cls(
            fingerprint=profile.fingerprint,
            cpu_model=m.cpu_model,
            arch=m.arch,
            logical_cores=m.logical_cores,
            physical_cores=m.physical_cores,
            cpu_flags=m.cpu_flags,
            execution_providers=list(profile.providers_profiled),
            peak_gemm_gflops_fp32=profile.peak_gemm_gflops_fp32,
            peak_gemm_gflops_int8=profile.peak_gemm_gflops_int8,
            memory_bandwidth_gbps=profile.memory_bandwidth_gbps,
            ops=dict(list(ops.items())[:MAX_OPS]),
        )


class SearchSpec(Plain):
    """What of the run's settings changes the landscape: the batch, the objective, the constraints."""

    batch: int = Field(1, ge=1)
    search_batch: bool = False
    objective: Objective = Objective()
    constraints: Constraints = Constraints()

    @classmethod
    def of(cls, settings: AdaptSettings) -> SearchSpec:
        return cls(
            batch=settings.batch,
            search_batch=settings.search_batch,
            objective=settings.objective,
            constraints=settings.constraints,
        )


class RunFeatures(Plain):
    """What similarity compares: the model, the hardware class and the spec of a run."""

    model: ModelFeatures
    hardware: HardwareFeatures
    spec: SearchSpec = SearchSpec()

    def context(self) -> SearchContext:
        h = self.hardware
        return SearchContext.from_peaks(
            h.peak_gemm_gflops_fp32, h.peak_gemm_gflops_int8, h.logical_cores, h.physical_cores, self.model.transformer
        )


class HistorySource(RunFeatures):
    label: Annotated[str, StringConstraints(max_length=256)] = Field("", description="Where it came from.")
    trials: list[HistoryTrial] = Field(default_factory=list, max_length=MAX_TRIALS)

    def winner(self) -> HistoryTrial | None:
        feasible = [t for t in self.trials if t.score is not None]
        return max(feasible, key=lambda t: t.score or 0.0) if feasible else None


class TrialHistory(Plain):
    """Earlier runs' trials, per source; bounded so that it fits a Kubernetes object."""

    sources: list[HistorySource] = Field(default_factory=list, max_length=MAX_SOURCES)

    @property
    def trials(self) -> int:
        return sum(len(s.trials) for s in self.sources)


# -- building sources -------------------------------------------------------------------------------------
def bounded_trials(trials: Sequence[HistoryTrial], limit: int = MAX_TRIALS) -> list[HistoryTrial]:
    """At most ``limit`` trials: the best feasible ones, and up to a quarter of failures (what to skip)."""
    if len(trials) <= limit:
        return list(trials)
    bad = [t for t in trials if t.score is None][: limit // 4]
    good = sorted((t for t in trials if t.score is not None), key=lambda t: -(t.score or 0.0))
    return good[: limit - len(bad)] + bad


def source_from_report(report: Report, label: str = "") -> HistorySource:
    """A source from a finished run's report: its model, hardware and spec, and every trial's point and outcome."""
    trials: list[HistoryTrial] = []
    for t in report.trials:
        latency = t.metrics.latency if t.metrics is not None else None
        failure = (t.violations[0] if t.violations else None) or t.error
        trials.append(
            HistoryTrial(
                point={str(k)[:64]: v for k, v in t.point.items()},
                status=t.status,
                score=t.score,
                p50_ms=latency.p50_ms if latency is not None else None,
                p95_ms=latency.p95_ms if latency is not None else None,
                quality_drop=t.metrics.quality.drop if t.metrics is not None else None,
                quality_measure=quality_measure(t.metrics.quality)[:96] if t.metrics is not None else None,
                failure=None if failure is None else str(failure)[:200],
            )
        )
    return HistorySource(
        model=ModelFeatures.of(report.model),
        hardware=HardwareFeatures.of(report.profile),
        spec=SearchSpec.of(report.settings),
        label=label[:256],
        trials=bounded_trials([t for t in trials if t.point]),
    )


def report_paths(paths: Iterable[Path]) -> list[Path]:
    """Every report.json under the given directories (recursively) plus the given files, each once."""
    found: dict[Path, None] = {}
    for path in paths:
        if path.is_dir():
            for p in sorted(path.rglob(REPORT_FILE)):
                found[p.resolve()] = None
        else:
            found[path.resolve()] = None
    return list(found)


def load_reports(paths: Iterable[Path]) -> tuple[list[HistorySource], list[str]]:
    """Sources from report.json files and directories; and, for each file that could not be used, why.

    Raises ``FileNotFoundError`` for a path that does not exist. A file that is not a readable report
    (another JSON, an older schema that no longer validates as ``Report``) is skipped with its reason rather
    than failing the run.
    """
    paths = list(paths)
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(str(path))
    sources: list[HistorySource] = []
    skipped: list[str] = []
    for path in report_paths(paths):
        try:
            sources.append(source_from_report(Report.model_validate_json(path.read_bytes()), label=str(path)))
        except ValidationError as exc:
            skipped.append(f"{path}: {_first_error(exc)[:200]}")
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            skipped.append(f"{path}: {first[:200]}")
    return sources, skipped


def _first_error(exc: ValidationError) -> str:
    """Why a file is no report, in one line: its first error and where (``started_at: Field required``)."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])


# -- similarity -----------------------------------------------------------------------------------------
def _ratio(a: float, b: float) -> float:
    """1 when equal, 1/2 when one is twice the other; 1 when either is unknown (0)."""
    if a <= 0 or b <= 0:
        return 1.0
    return math.exp(-abs(math.log(a / b)))


def _jaccard(a: Iterable[str], b: Iterable[str]) -> float:
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


def _geomean(parts: Sequence[tuple[float, float]]) -> float:
    """Weighted geometric mean of (value, weight): one component near 0 pulls the whole down."""
    total = sum(w for _, w in parts)
    return math.exp(sum(w * math.log(max(v, 1e-6)) for v, w in parts) / total) if total else 1.0


def hardware_similarity(a: HardwareFeatures, b: HardwareFeatures) -> float:
    if a.fingerprint == b.fingerprint:
        return 1.0
    parts = [
        (_jaccard(a.execution_providers, b.execution_providers), 2.0),
        (_ratio(a.logical_cores, b.logical_cores), 1.0),
        (_ratio(a.peak_gemm_gflops_fp32, b.peak_gemm_gflops_fp32), 1.0),
        (_ratio(_gain(a), _gain(b)), 1.0),
        (_ratio(a.memory_bandwidth_gbps, b.memory_bandwidth_gbps), 0.5),
        (_jaccard(a.cpu_flags, b.cpu_flags), 0.5),
    ]
    common = set(a.ops) & set(b.ops)
    if common:
        parts.append((sum(a.ops[k] == b.ops[k] for k in common) / len(common), 2.0))
    return _geomean(parts) * (1.0 if a.arch == b.arch else 0.3)


def _gain(h: HardwareFeatures) -> float:
    if h.peak_gemm_gflops_fp32 <= 0 or h.peak_gemm_gflops_int8 <= 0:
        return 0.0
    return h.peak_gemm_gflops_int8 / h.peak_gemm_gflops_fp32


def model_similarity(a: ModelFeatures, b: ModelFeatures) -> float:
    if a.sha256 == b.sha256:
        return 1.0
    ops = sorted(set(a.op_counts) | set(b.op_counts))
    va = np.array([a.op_counts.get(o, 0) for o in ops], dtype=float)
    vb = np.array([b.op_counts.get(o, 0) for o in ops], dtype=float)
    norm = float(np.linalg.norm(va) * np.linalg.norm(vb))
    mix = float(va @ vb) / norm if norm else 0.0
    size = float(_ratio(a.parameters, b.parameters) ** 0.25) * float(_ratio(a.size_bytes, b.size_bytes) ** 0.25)
    same_kind = 1.0 if a.transformer == b.transformer else 0.5
    return max(0.0, min(1.0, mix * size * same_kind))


def spec_similarity(a: SearchSpec, b: SearchSpec) -> float:
    batch = math.exp(-0.15 * abs(math.log2(a.batch / b.batch)))
    wa, wb = (
        np.array([o.latency_weight, o.throughput_weight, o.memory_weight, o.quality_weight])
        for o in (a.objective, b.objective)
    )
    weights = float(wa @ wb / (np.linalg.norm(wa) * np.linalg.norm(wb)))
    return max(0.0, min(1.0, batch * weights * (1.0 if a.search_batch == b.search_batch else 0.8)))


def similarity(current: RunFeatures, source: RunFeatures) -> Similarity:
    """How much a source's landscape is expected to look like this run's (1 = same model, class and spec)."""
    hw = hardware_similarity(current.hardware, source.hardware)
    mo = model_similarity(current.model, source.model)
    sp = spec_similarity(current.spec, source.spec)
    return Similarity(total=hw * mo * sp, hardware=hw, model=mo, spec=sp)


def rank(current: RunFeatures, sources: Sequence[HistorySource]) -> list[tuple[HistorySource, Similarity]]:
    """Sources most similar first (ties: more trials first, then label)."""
    scored = [(s, similarity(current, s)) for s in sources]
    return sorted(scored, key=lambda ss: (-ss[1].total, -len(ss[0].trials), ss[0].label))


def select(current: RunFeatures, sources: Sequence[HistorySource], limit: int = MAX_SOURCES) -> TrialHistory:
    """The ``limit`` sources most similar to this run, as a bounded history (what the operator hands over).

    Unrelated ones may remain when there are few: ``warm_start`` ignores them and says so.
    """
    return TrialHistory(sources=[s for s, _ in rank(current, sources)][:limit])


# -- warm start -----------------------------------------------------------------------------------------
INT8_OPS = (
    "MatMulInteger",
    "DynamicQuantizeLinear",
    "QuantizeLinear",
    "DequantizeLinear",
    "QLinearConv",
    "QLinearMatMul",
)


def _matters_alike(current: RunFeatures, source: RunFeatures, point: dict[str, Scalar]) -> bool:
    """Whether the two profiles agree on every op this point runs, in its dtype, on its provider."""
    if current.hardware.fingerprint == source.hardware.fingerprint:
        return True
    mode = str(point.get("quantization", "fp32"))
    dtype = "fp16" if mode == "fp16" else "int8" if mode.startswith("int8") else "fp32"
    provider = str(point.get("execution_provider", "CPUExecutionProvider"))
    ops = set(current.model.op_counts) | (set(INT8_OPS) if dtype == "int8" else set())
    a, b = current.hardware.ops, source.hardware.ops
    relevant = [k for k in a if k.split("/")[0] in ops and f"/{dtype}" in k and k.endswith(f"@{provider}")]
    if not relevant or any(k not in b for k in relevant):
        return False  # cannot tell: measure it again
    return all(a[k] == b[k] for k in relevant)


def warm_start(
    space: Space,
    current: RunFeatures,
    history: TrialHistory | Sequence[HistorySource],
    measure: str | None = None,
) -> tuple[Prior, HistoryUse]:
    """The search's prior for this run from ``history``, and the account of it for the report.

    ``measure`` is this run's quality_measure(): a source's trial that missed the quality budget is skipped as a
    known failure only when its drop was measured the same way (outputs of one number per sample were once scored
    by cosine, which called a halved probability lossless). Without a useful source this is the built-in prior
    unchanged (a cold start).
    """
    sources = list(history.sources if isinstance(history, TrialHistory) else history)
    base = builtin_prior(space, current.context())
    evidence: list[Evidence] = []
    uses: list[SourceUse] = []
    ignored: list[str] = []
    firsts: list[Key] = []
    avoid: set[Key] = set()
    related = False
    for source, sim in rank(current, sources):
        if sim.total < USEFUL or len(evidence) >= MAX_SOURCES:
            ignored.append(f"{source.label or source.model.sha256[:12]}: similarity {sim.total:.2f}"[:300])
            continue
        if not any(set(t.point) & set(space.names) for t in source.trials):
            ignored.append(f"{source.label or source.model.sha256[:12]}: no trial shares a knob with this run"[:300])
            continue
        mapped = [(k, t) for t in source.trials if (k := key_in(space, t.point)) is not None]
        evidence.append(
            Evidence(
                sim.total,
                source.context(),
                tuple(t.point for t in source.trials),
                tuple(t.score for t in source.trials),
                source.label,
            )
        )
        winner = source.winner()
        if sim.total >= RELATED:
            related = True
            for key, trial in mapped:
                if _known_failure(current, source, trial, measure) and _matters_alike(current, source, trial.point):
                    avoid.add(key)
        uses.append(
            SourceUse(
                label=source.label or source.model.sha256[:12],
                model_sha256=source.model.sha256,
                hardware_fingerprint=source.hardware.fingerprint,
                batch=source.spec.batch,
                similarity=sim,
                trials=len(source.trials),
                winner=dict(winner.point) if winner is not None else None,
            )
        )
        if sim.total >= RELATED and winner is not None and len(firsts) < FIRST_WINNERS:
            projected = project(space, winner.point, base)
            if projected is not None and projected not in avoid:
                firsts.append(projected)
    prior = warm_prior(space, base, evidence, first=firsts, avoid=sorted(avoid), warm=related) if evidence else base
    allowed_avoided = sum(1 for k in avoid if space._key_allowed(k))
    use = HistoryUse(
        offered=len(sources),
        sources=uses,
        ignored=ignored[:32],
        warm=related,
        trials_used=sum(u.trials for u in uses),
        first_points=[space.point(k) for k in prior.first],
        skipped_known_failures=allowed_avoided,
    )
    return prior, use


def _known_failure(current: RunFeatures, source: HistorySource, trial: HistoryTrial, measure: str | None) -> bool:
    """A trial whose outcome would repeat here: it failed to build or run, or missed the quality budget by far
    in the same measure as this run's."""
    if current.model.sha256 != source.model.sha256:
        return False  # another model's failures say little about this one's
    if trial.status == TrialStatus.FAILED:
        return True
    if trial.status != TrialStatus.INFEASIBLE or trial.quality_drop is None:
        return False
    if measure is None or trial.quality_measure != measure:
        return False  # a drop in another measure says nothing of this run's budget: measure it again
    return trial.quality_drop > 1.5 * current.spec.constraints.max_quality_drop
