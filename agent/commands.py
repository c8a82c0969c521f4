"""The CLI's commands: argument plumbing around core, plus human-readable output."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from metainfer.agent.progress import progress_for
from metainfer.core.engine.errors import DataError, InputError, ModelError, NoFeasibleCandidate
from metainfer.core.engine.phases import PipelinePhase
from metainfer.core.engine.trial import TrialStatus

if TYPE_CHECKING:  # the report module loads ONNX Runtime: imported when a command runs, not for --help
    from metainfer.core.engine.report import Report

# Tables are read in CI logs and pipes too, where rich would assume 80 columns.
console = Console(stderr=True, width=None if Console(stderr=True).is_terminal else 120)
out = Console(width=None if Console().is_terminal else 120)


def runtime_command(*, providers: bool) -> int:
    """`metainfer runtime`: the runtime identity; with ``providers``, JSON adding each EP of this build and whether
    it runs here (what an image flavour is checked by: hack/image/build.py runs it as the image's user)."""
    import json

    from metainfer.core.engine.runtime_identity import runtime_identity

    if not providers:
        print(runtime_identity())
        return 0
    import onnxruntime as ort

    from metainfer.core.engine.runtime import provider_usability

    usability = provider_usability(ort.get_available_providers())
    print(json.dumps({"runtime": runtime_identity(), "onnxruntime": ort.__version__, "providers": usability}))
    return 0


def profile_command(out_path: Path | None, refresh: bool) -> int:
    from metainfer.core.engine.profile import SUMMARY_COLUMNS, load_or_measure

    with progress_for(console) as observer:
        observer.phase(PipelinePhase.PROFILING, None)
        profile = load_or_measure(on_step=observer.on_step, refresh=refresh)
    m = profile.machine
    out.print(
        f"[bold]{m.cpu_model}[/] ({m.arch}, {m.physical_cores} cores / {m.logical_cores} threads)"
        f"  ONNX Runtime {m.onnxruntime_version}  fingerprint {profile.fingerprint}"
    )
    out.print(f"flags: {' '.join(m.cpu_flags)}")
    out.print(
        f"peak GEMM fp32 {profile.peak_gemm_gflops_fp32:.1f} GFLOP/s, int8 {profile.peak_gemm_gflops_int8:.1f}"
        f" GOP/s; memory bandwidth {profile.memory_bandwidth_gbps:.1f} GB/s"
    )
    table = Table(*SUMMARY_COLUMNS, title="operator support")
    for row in profile.summary_rows():
        style = {"native": "", "fallback": "yellow", "unsupported": "red"}[row[4]]
        table.add_row(*row, style=style)
    out.print(table)
    for unusable in profile.unusable_providers:
        out.print(f"[yellow]{unusable.provider} unusable here (not profiled):[/] {unusable.reason}", highlight=False)
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(profile.model_dump_json(indent=2))
        out.print(f"profile written to {out_path}")
    return 0


def adapt_command(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="metainfer-adapt-") as fetched:
        model_path, data_path = _local_inputs(args, Path(fetched))
        return _adapt(args, model_path, data_path)


def _local_inputs(args: argparse.Namespace, workdir: Path) -> tuple[Path, Path | None]:
    """MODEL and --data (if given) as local files: URIs are fetched (and checked against their sha256 when given)
    with the store's keys from --credentials, else from the environment (agent/object_store.py)."""
    from metainfer.agent import object_store
    from metainfer.agent.fetch import FetchError, fetch

    if args.credentials is not None:
        os.environ[object_store.CREDENTIALS_ENV] = str(args.credentials)
    else:  # one's own machine: the SDKs' environment variables and the default credential chains apply
        os.environ.setdefault(object_store.AMBIENT_ENV, "true")
    paths: list[Path | None] = []
    for source, sha256, what, error in (
        (args.model, args.model_sha256, "model", ModelError),
        (args.data, args.data_sha256, "data", DataError),
    ):
        if source is None or isinstance(source, Path):
            paths.append(source)
            continue
        name = "model.onnx" if what == "model" else "data.npz"
        try:
            with console.status(f"fetching {source}"):
                paths.append(fetch(source, workdir / name, expected_sha256=sha256, namespace="", configmaps=None,
                                   what=what))  # fmt: skip
        except FetchError as exc:
            raise error(source, str(exc).removeprefix(f"{what} ").removeprefix(f"{source}: ")) from None
    model = paths[0]
    assert model is not None  # MODEL is a required argument
    return model, paths[1]


def _adapt(args: argparse.Namespace, model_path: Path, data_path: Path | None) -> int:
    from metainfer.core.engine.data import load_npz
    from metainfer.core.engine.evaluate import MeasureSettings
    from metainfer.core.engine.modelinfo import inspect_model, load_model, model_bytes
    from metainfer.core.engine.outputs import write_outputs
    from metainfer.core.engine.pipeline import Adaptation
    from metainfer.core.engine.profile import load_or_measure
    from metainfer.core.engine.report import AdaptSettings
    from metainfer.core.engine.scoring import Constraints, Objective

    model = load_model(model_path)
    info = inspect_model(model_path, model)
    from metainfer.core.engine.decoder.signature import detect

    decoder = detect(model)
    if decoder is not None:
        from metainfer.agent.decoder_adapt import adapt_decoder

        return adapt_decoder(args, model, model_bytes(model_path, model), decoder)
    if data_path is not None:
        data = load_npz(data_path, info)
    else:
        from metainfer.agent.inputs import synthetic_dataset, synthetic_note

        data = synthetic_dataset(info, args.input_shapes, args.seed, field="--input-shape")
        note = synthetic_note(info, args.input_shapes, data, "--input-shape NAME=D0,D1,...")
        console.print(f"note: no --data: {note}", highlight=False)
    if args.batch > data.n_samples:
        console.print(
            f"[yellow]warning:[/] --batch {args.batch} is larger than the {data.n_samples} samples in"
            f" {args.data or 'the random inputs'}:"
            f" timed batches repeat samples, and quality runs in one batch of {data.n_samples}",
            highlight=False,
        )
    settings = AdaptSettings(
        batch=args.batch,
        search_batch=args.search_batch,
        constraints=Constraints(
            slo_p95_ms=args.slo_p95_ms,
            slo_p99_ms=args.slo_p99_ms,
            max_quality_drop=args.max_accuracy_drop,
            quality_metric=args.quality_metric,
            max_memory_mib=args.max_memory_mib,
            max_variant_memory_mib=_variant_memory_bound(args.serving_memory_limit_mib),
        ),
        objective=Objective(
            latency_weight=args.latency_weight,
            throughput_weight=args.throughput_weight,
            memory_weight=args.memory_weight,
            quality_weight=args.quality_weight,
        ),
        budget_trials=args.budget_trials,
        time_budget_s=args.time_budget_s,
        algorithm=args.algorithm,
        seed=args.seed,
        measure=MeasureSettings(),
    )
    sources = _history_sources(args.history) if args.history else None
    with progress_for(console) as observer:
        observer.phase(PipelinePhase.PROFILING, None)
        profile = load_or_measure(on_step=observer.on_step)
        _warn_unusable_providers()
        adaptation = Adaptation(model_bytes(model_path, model), info, data, profile, settings, observer)
        if sources is not None:
            from metainfer.core.engine.history import select

            adaptation.history = select(adaptation.features(), sources)
        report, variant = adaptation.run()
    written = write_outputs(args.out, report, variant)
    _print_summary(report)
    out.print("wrote " + ", ".join(str(p) for p in written))
    if report.best is None:
        raise NoFeasibleCandidate(_infeasible_message(report, args.out), closest=report.closest_misses())
    return 0


def _infeasible_message(report: Report, out_dir: Path) -> str:
    """Why ``adapt`` found nothing to ship, on one line: what validation rejected, and what FP32 measured against
    the SLO when it is the fallback a cluster would keep serving (``adapt`` itself writes no model then)."""
    from metainfer.core.control.runstatus import rejected_message

    message = f"none of {len(report.trials)} candidates met every constraint (report: {out_dir / 'report.json'})"
    if report.rejected_by_validation:
        message += f"; {rejected_message(report)}"
    if report.slo_unmet_fallback is not None:
        message += f"; the fallback a cluster keeps serving, with the SLO unmet: {report.slo_unmet_fallback.describe()}"
    return message


def _variant_memory_bound(limit_mib: float | None) -> float | None:
    """What a serving container of ``limit_mib`` leaves a variant, serve's floor measured here
    (core.control.memory_bound, as the cluster's Job does)."""
    if limit_mib is None:
        return None
    from metainfer.agent.serve.floor import serve_floor_mib
    from metainfer.core.control.memory_bound import variant_memory_bound_mib

    return variant_memory_bound_mib(int(limit_mib), serve_floor_mib())


def _warn_unusable_providers() -> None:
    """Say which EPs this ONNX Runtime offers but cannot use here (they are not searched), with its reason."""
    from metainfer.core.engine.runtime import available_providers, provider_usability

    for provider, why in provider_usability(available_providers()).items():
        if why:
            console.print(f"[yellow]warning:[/] {provider} is not searched: {why}", highlight=False)


def _history_sources(paths: list[Path]) -> list[Any]:
    """The --history reports as history sources; a named file that is no readable report is an input error."""
    from metainfer.core.engine.history import load_reports, report_paths

    try:
        sources, skipped = load_reports(paths)
    except FileNotFoundError as exc:
        raise InputError(f"--history {exc.args[0]}", "no such file or directory") from None
    named = {p.resolve() for p in paths if p.is_file()}
    for line in skipped:
        path, _, why = line.partition(": ")
        if Path(path) in named:
            raise InputError(f"--history {path}", f"not a readable metainfer report.json ({why})")
        console.print(f"[yellow]warning:[/] --history: skipped {line}", highlight=False)
    if not sources:
        raise InputError("--history", f"none of the {len(report_paths(paths))} report(s) could be read")
    return sources


def examples_command(out_dir: Path, only: list[str] | None) -> int:
    from metainfer.agent.zoo import build_examples

    try:
        built = build_examples(out_dir, only or None)
    except KeyError as exc:
        raise InputError("--only", str(exc.args[0])) from exc
    for name, example in built.items():
        out.print(f"[bold]{name}[/]: {example.model_path} + {example.data_path} — {example.description}")
    return 0


def _print_summary(report: Report) -> None:
    table = Table(title=f"{Path(report.model.path).name}: baseline vs adapted (batch {report.settings.batch})")
    for column in ("", "recipe", "p50 ms", "p95 ms", "quality", "size MiB", "peak MiB"):
        table.add_column(column, justify="right" if column.endswith(("ms", "MiB")) else "left")
    final = report.final if report.final is not None and not report.final.kept_baseline else None
    rows = [("FP32 baseline", report.baseline, final.baseline if final else report.baseline.metrics)]
    if report.best is not None:
        rows.append(("adapted", report.best, final.best if final else report.best.metrics))
    elif report.slo_unmet_fallback is not None:
        fallback = report.slo_unmet_fallback.trial
        rows.append(("FP32 fallback (SLO unmet)", fallback, fallback.metrics))
    for label, trial, m in rows:
        assert m is not None
        table.add_row(
            label,
            trial.recipe.describe(),
            f"{m.latency.p50_ms:.3g}",
            f"{m.latency.p95_ms:.3g}",
            f"{m.quality.metric} {m.quality.value:.4f}",
            f"{m.model_size_mib:.2f}",
            f"{m.peak_memory_mib:.1f}",
        )
    out.print(table)
    counts = {s.value: sum(t.status == s for t in report.trials) for s in TrialStatus}
    out.print(
        f"{len(report.trials)} trials ({counts['feasible']} feasible, {counts['infeasible']} infeasible,"
        f" {counts['failed']} failed) in {report.search_wall_s:.1f} s of search; {report.stop_reason};"
        f" total {report.total_wall_s:.1f} s"
    )
    raced = sum(t.metrics is not None and t.metrics.early_stop == "raced" for t in report.trials)
    screened = sum(t.metrics is not None and t.metrics.early_stop == "quality_screen" for t in report.trials)
    if raced or screened or report.sensitivity_wall_s:
        out.print(
            f"of the search time, {report.sensitivity_wall_s:.1f} s went to sensitivity scans; {raced} candidate(s)"
            " stopped timing once clearly slower than the best so far, and"
            f" {screened} once clearly over the quality budget on the first samples",
            highlight=False,
        )
    if report.latency_noise_band is not None:
        measured = sum(t.metrics is not None for t in [report.baseline, *report.trials])
        out.print(
            f"timing noise band ±{report.latency_noise_band:.1%} (the median over {measured} measurements of what"
            " each one's timed runs can resolve): candidates whose latencies differ by less count as equally"
            " fast, and memory and quality decide between them",
            highlight=False,
        )
    if final is not None:
        out.print(
            f"[bold green]speedup {final.speedup_p50:.2f}x at p50, {final.speedup_p95:.2f}x at p95[/]"
            " (re-measured back to back with the baseline; never shipped when slower than it at"
            f" {final.slo_percentile}, the SLO's percentile)"
        )
    if report.final is not None and report.final.runoff:
        entrants = ", ".join(
            f"{e.recipe} {e.search_p50_ms:.3g} -> {e.p50_ms:.3g} ms{' (shipped)' if e.shipped else ''}"
            for e in report.final.runoff
        )
        out.print(f"final race, p50 in the search -> back to back: {entrants}", highlight=False)
    if report.final is not None and report.final.note:
        out.print(f"[bold yellow]{report.final.note}[/]")
    if report.fallback_note:  # no variant passed validation: FP32 ships
        out.print(f"[bold yellow]{escape(report.fallback_note)}[/]", highlight=False)
    if report.quality_granularity_note:
        out.print(f"[yellow]warning:[/] {escape(report.quality_granularity_note)}", highlight=False)
    if memory := report.memory_note():
        out.print(f"memory: {escape(memory)}", highlight=False)
    if report.history is not None:
        _print_history(report)
    for note in report.space.notes:  # what the search left out or changed, and why
        out.print(f"note: {note}", highlight=False)
    if report.validation is not None:
        for check in report.validation.checks:
            mark = "[green]ok[/]" if check.passed else "[red]FAIL[/]"
            out.print(f"  {mark} {check.name}: {check.detail}")


def _print_history(report: Report) -> None:
    assert report.history is not None
    h = report.history
    used = ", ".join(f"{u.label} (similarity {u.similarity.total:.2f}, {u.trials} trials)" for u in h.sources)
    if not h.warm:
        out.print(
            f"history: {h.offered} source(s) offered, none related enough to start from"
            + (f" (used as weak evidence: {used})" if used else "")
            + "; cold start",
            highlight=False,
        )
        return
    out.print(
        f"history: warm start from {used}; the related winner re-measured first, {h.skipped_known_failures} known"
        f" failure(s) skipped; best found at trial {h.best_found_at}; {h.trials_saved} trial(s) of the budget saved",
        highlight=False,
    )
