"""The saved results as typed records: one pydantic model per benchmark, validated from bench/results/<name>.json.

A record is what a section of BENCHMARKS.md is rendered from (bench/render.py),
so a field the section shows is a field here. The frame every result carries
(the benchmark's name, the command that made it, the machine it ran on) is
``Record``; each benchmark adds its own fields, and ``extra="forbid"`` makes a
result with a field no record declares fail loudly instead of being dropped.
Rows of the peer matrices and of the operator-scale curve stay dicts: each
matrix row carries one column set per contender that ran, which the renderers
read with ``.get``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Machine(Strict):
    """benchlib.machine(): where and when a result was measured."""

    cpu_model: str
    arch: str
    logical_cores: int
    physical_cores: int
    cpu_flags: list[str]
    memory_gib: int | float
    onnxruntime: str
    onnx: str
    python: str
    date: str
    commit: str


class Record(Strict):
    benchmark: str
    command: str
    machine: Machine


class MatrixResult(Record):
    """bench/export_matrix.py and bench/cnn_matrix.py: one row per model, one column set per contender."""

    trials: int
    rows: list[dict[str, Any]]


class OperatorScaleResult(Record):
    quick: bool
    plan: dict[str, Any]
    points: list[dict[str, Any]]
    load: str = "not recorded"
    gpu_resource_workaround: bool
    duration_s: float
    # True when the section's text was rendered again after the run (operator_scale.py --render-from): the
    # section then says when the numbers were measured.
    rerendered: bool = False
    note: str | None = None
    # operator_scale.py --profile: the event loop's busy CPU by group, from one more converge under cProfile.
    profile: dict[str, Any] | None = None


class RealNodeResult(Record):
    cluster: list[dict[str, float]]
    image: dict[str, Any]
    e2e: dict[str, Any]
    e2e_wall_s: float


class ContinuityResult(Record):
    """bench/continuity.py: the e2e suite's timings (its "continuity" scenarios) and its wall time."""

    e2e: dict[str, Any]
    e2e_wall_s: float


class PodStartResult(Record):
    model: str
    recipe: dict[str, Any]
    variant_sha256: str
    variant_bytes: int
    base_bytes: int
    build_in_process_s: float
    seconds_to_ready: dict[str, list[float]]
    median_s: dict[str, float]


class OliveMeasured(Strict):
    """One model measured again after the searches (bench/olive_measure.Measured)."""

    name: str
    options: str
    p50_ms: float
    p95_ms: float
    quality: float
    drop: float
    metric: str
    size_mib: float


class OliveSearch(Strict):
    """What one search produced (bench/olive_output.SearchOutcome, less its tool)."""

    wall_s: float
    model_path: str | None = None
    session_options: dict[str, Any]
    detail: dict[str, Any]
    error: str | None = None


class OliveModelResult(Strict):
    batch: int
    samples: int
    budget: int
    measured: list[OliveMeasured]
    olive: OliveSearch
    metainfer: OliveSearch
    verdict: bool | None
    verdict_text: str
    # A missed verdict's explanation, computed from metainfer's report.json in the run's work dir when the
    # run ends and kept here, since that dir is temporary.
    why: str | None = None


class OlivePeerResult(Record):
    quick: bool
    budget: int
    rounds: int
    max_accuracy_drop: float
    seed: int
    threads: list[int]
    olive_venv: str
    work: str
    load_start: str
    load_end: str | None = None
    olive_env: dict[str, Any] = {}
    olive_unavailable: str | None = None
    models: dict[str, OliveModelResult]


class AdaptationProfile(Strict):
    """The hardware profile an adaptation result depends on (bench/adaptation.profile_summary)."""

    fingerprint: str
    peak_gemm_gflops_fp32: float
    peak_gemm_gflops_int8: float
    memory_bandwidth_gbps: float
    measured_at: str  # ISO 8601
    # Saved since the section became data-rendered; older results lack them (logical_cores was migrated from the
    # section's text, the probe sizes were never shown there and stay unknown).
    logical_cores: int | None = None
    gemm_n: int | None = None
    bandwidth_mib: int | None = None


class AdaptationResult(Record):
    """bench/adaptation.py: one result per model (a dict: adapted and failed models carry different fields)."""

    mode: Literal["quick", "full"]
    models_planned: int
    seed: int
    max_quality_drop: float
    profile: AdaptationProfile
    # The profile the run itself used, when --reroof recomputed the roofline against a newer one.
    run_profile: AdaptationProfile | None = None
    notes: list[str]
    wall_s: float
    results: list[dict[str, Any]]


class WarmClass(Strict):
    """One hardware class's landscape (bench/warm_start.landscape_facts)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    class_: str = Field(alias="class")
    what: str
    file: str
    allowed_points: int
    optimum: float
    optimum_recipe: str
    optimum_p50_ms: float
    baseline_p50_ms: float
    fingerprint: str
    measured_at: str | None = None
    wall_s: float | None = None


class WarmScenario(Strict):
    target: str
    source: str
    what: str
    useless: bool
    similarity: dict[str, float]
    landscapes_differ: dict[str, Any]
    # start (warm, cold, space-filling) -> search_replay.AlgorithmResult.summary()
    results: dict[str, dict[str, Any]]
    verdict: dict[str, Any]
    warm_first_evaluation_fraction: float


class WarmStartResult(Record):
    seeds: int
    budgets: list[int]
    top_budget: int
    source_budget: int
    level: float
    classes: dict[str, WarmClass]
    scenarios: list[WarmScenario]
    why: str
    # Saved since the section became data-rendered; the committed result's were migrated from its text (so whole
    # seconds).
    replay_wall_s: float
    jobs: int  # replay processes


class ProbeStats(Strict):
    probes: int
    p50_ms: float
    p99_ms: float
    max_ms: float


class AttackStats(Strict):
    """testkit/serve_attacks.AttackResult, as saved."""

    name: str
    answered: int
    failed: int
    refused: int
    cut: int
    liveness_max_ms: float
    liveness_failures: int
    rss_baseline_mib: float
    rss_peak_mib: float
    rss_after_mib: float
    seconds: float
    notes: list[str]


class ServingMatrix(Strict):
    """bench/serving.run_matrix: one cell per (server, protocol, batch, clients)."""

    cells: list[dict[str, Any]]
    agreement: dict[str, float]
    variant_sha256: str
    metainfer_variant_sha256: str | None = None
    kserve_env: dict[str, Any] | None = None
    kserve_unavailable: str | None = None


class ServingResult(Record):
    """bench/serving.py: the parts that ran (matrix, ratio, probes, attacks), each optional."""

    seconds: float
    warmup_s: float
    parts: list[str]
    load_start: list[float]
    load_end: list[float]
    matrix: ServingMatrix | None = None
    cases: dict[str, dict[str, Any]] | None = None
    ratio: float | None = None
    ratio_unbatched: float | None = None
    probes: dict[str, ProbeStats] | None = None
    attacks: list[AttackStats] | None = None
    chaos: list[dict[str, Any]] | None = None  # testkit/serve_chaos.ChaosResult rows, with calls_per_s and passed


class LandscapeSummary(Strict):
    """What a search-efficiency section says of one measured landscape (bench/search_efficiency.landscape_summary)."""

    points: int
    feasible: int
    failed: int
    optimum_score: float
    optimum_recipe: str
    optimum_p50_ms: float
    baseline_p50_ms: float
    measured_at: str
    wall_s: float
    load_before: float  # 1-minute load average
    load_after: float
    niceness: int | None = None


class WinnerPick(Strict):
    """What the winning algorithm found within a budget on seed 0 (found None: nothing feasible)."""

    algorithm: str
    found: str | None = None
    fraction: float | None = None
    at: int | None = None


class BeatenAt(Strict):
    """Why the hybrid was beaten at one budget (bench/search_efficiency.why_facts)."""

    budget: int
    n_initial: int
    start: Literal["prior", "space-filling"]
    pick: WinnerPick
    chance: float  # that `budget` uniform draws include a point within 5 % of the optimum


class WhyBeaten(Strict):
    near_optimal_points: int
    size: int
    top5_spread: float
    baseline_p50_ms: float
    budgets: list[BeatenAt]


class SearchModelResult(Strict):
    batch: int
    landscape: str
    landscape_key: dict[str, Any]
    landscape_summary: LandscapeSummary
    reused: bool  # the landscape came from the cache, not measured by this run
    allowed_points: int
    optimum: float
    # algorithm -> search_replay.AlgorithmResult.summary()
    results: dict[str, dict[str, Any]]
    verdict: dict[str, Any]
    why_beaten: WhyBeaten | None = None
    plot: str
    replayed_at: str


class SearchEfficiencyResult(Record):
    seeds: int
    budgets: list[int]
    algorithms: list[str]
    models: dict[str, SearchModelResult]
    notes: list[str] = []
    why: str


class GraphLeversResult(Record):
    """bench/graph_levers.py: per model, each format and runtime timed with activations as exported and fused."""

    rows: list[dict[str, Any]]


class WeightsResult(Record):
    """bench/weights.py: per model, the fixed weight variants measured, and metainfer's pick per memory budget."""

    rows: list[dict[str, Any]]


class LlmPeersResult(Record):
    """bench/llm_peers.py: SmolLM2 on llama.cpp, ONNX Runtime GenAI, OpenVINO GenAI and metainfer, a row each."""

    setup: dict[str, Any]
    workload: dict[str, Any]
    rows: list[dict[str, Any]]


class RuntimeChoiceResult(Record):
    """bench/runtime_choice.py: one row per model, the runtime the search picked and five contenders' latency."""

    trials: int
    rows: list[dict[str, Any]]
