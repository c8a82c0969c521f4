"""The Olive section's verdict and prose: what the measurements mean, rendered as markdown.

One job: from the saved results (bench/results/olive_peer.json) judge the
target (metainfer's variant at least as fast as Olive's at equal or better
quality), explain a missed verdict from metainfer's own trials, and write the
section's text. It measures nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench import benchlib
from bench.olive_measure import Measured
from bench.olive_workflow import MAX_DROP, OLIVE_REPEAT, SEED
from metainfer.core.engine.report import Report

QUALITY_TIE = 0.001  # quality within a tenth of the accuracy budget counts as equal


def verdict(rows: list[Measured]) -> tuple[bool | None, str]:
    """Target: metainfer's variant at least as fast as Olive's (p50), at equal or better quality."""
    by_name = {r.name: r for r in rows}
    ours, olive = by_name.get("metainfer best"), by_name.get("Olive best")
    if ours is None or olive is None:
        missing = "metainfer" if ours is None else "Olive"
        return None, f"not judged: {missing} produced no model (see above)"
    faster = ours.p50_ms <= olive.p50_ms
    quality_ok = ours.drop <= olive.drop + QUALITY_TIE
    ratio = olive.p50_ms / ours.p50_ms
    text = (
        f"metainfer p50 {_ms(ours.p50_ms)} ms vs Olive {_ms(olive.p50_ms)} ms ({ratio:.2f}x), "
        f"quality drop {ours.drop:.4f} vs {olive.drop:.4f}"
    )
    if faster and quality_ok:
        return True, f"**met**: {text}"
    why = []
    if not faster:
        why.append("Olive's variant is faster")
    if not quality_ok:
        why.append(f"metainfer's quality drop is more than {QUALITY_TIE} worse")
    return False, f"**missed** ({'; '.join(why)}): {text}"


def _ms(value: float) -> str:
    """Milliseconds with three significant digits, so a 0.06 ms MLP does not print as 0.1 for every model."""
    return f"{value:.1f}" if value >= 100 else f"{value:.3g}"


def _fmt_row(r: Measured, fp32_p50: float, wall: str, evaluated: str) -> list[str]:
    return [
        r.name,
        r.options,
        _ms(r.p50_ms),
        _ms(r.p95_ms),
        f"{fp32_p50 / r.p50_ms:.2f}x",
        f"{r.quality:.4f}",
        f"{r.drop:.4f}",
        f"{r.size_mib:.1f}",
        wall,
        evaluated,
    ]


def render_model(name: str, result: dict[str, Any]) -> str:
    """One model's markdown: the table, what each search did, the verdict."""
    header = [
        "model",
        "what it is",
        "p50 ms",
        "p95 ms",
        "vs FP32",
        "quality",
        "drop",
        "MiB",
        "search wall s",
        "candidates evaluated",
    ]
    rows = [Measured(**r) for r in result["measured"]]
    fp32_p50 = rows[0].p50_ms
    olive, ours = result["olive"], result["metainfer"]
    search = {
        "Olive best": (
            f"{olive['wall_s']:.0f}",
            f"{olive['detail'].get('olive_candidates_evaluated', '?')} of {result['budget']}",
        ),
        "metainfer best": (f"{ours['wall_s']:.0f}", f"{ours['detail'].get('trials', '?')} of {result['budget']}"),
    }
    table = benchlib.markdown_table(header, [_fmt_row(r, fp32_p50, *search.get(r.name, ("-", "-"))) for r in rows])
    lines = [
        f"### {name} (batch {result['batch']}, {result['samples']} samples, quality = {rows[0].metric})",
        table,
    ]
    for label, outcome in (("Olive", olive), ("metainfer", ours)):
        if outcome.get("error"):
            lines.append(f"{label} failed: `{outcome['error']}`")
    if not olive.get("error"):
        d = olive["detail"]
        lines.append(
            f"Olive's search: {d.get('olive_candidates_evaluated', '?')} candidates evaluated "
            f"({d.get('olive_candidates_meeting_goal', '?')} within the quality budget, "
            f"{d.get('olive_steps_failed', 0)} steps failed) out of {result['budget']} samples requested; "
            f"Olive's log: `{d.get('log')}`."
        )
    if not ours.get("error"):
        d = ours["detail"]
        search_s = d.get("search_wall_s")
        lines.append(
            f"metainfer's run: {d.get('trials', '?')} trials ({d.get('stop_reason')}); its search loop took "
            f"{search_s:.0f} s of the {ours['wall_s']:.0f} s command (the rest: hardware profile, cached after "
            f"the first run on a machine, FP32 baseline, sensitivity scan, validation)."
            if isinstance(search_s, (int, float))
            else f"metainfer's run: {d.get('trials', '?')} trials."
        )
    lines.append(f"Verdict: {result['verdict_text']}")
    if result.get("verdict") is False:
        why = result.get("why")
        lines.append(why if why is not None else why_slower(rows, ours))
    return "\n\n".join(lines)


def why_slower(rows: list[Measured], ours: dict[str, Any]) -> str:
    """For a missed verdict: the size of the gap, and how metainfer's own trials ranked the same kind of variant."""
    by_name = {r.name: r for r in rows}
    mine, theirs = by_name.get("metainfer best"), by_name.get("Olive best")
    if mine is None or theirs is None:
        return ""
    gap_ms = mine.p50_ms - theirs.p50_ms
    text = f"Why: Olive's variant measured {gap_ms * 1000:.1f} µs ({gap_ms / theirs.p50_ms:.0%}) faster per batch here."
    report_path = Path(ours.get("model_path") or "").parent / "report.json"
    olive_per_channel = "per-channel" in theirs.options
    if not report_path.is_file():
        return text
    report = Report.model_validate_json(report_path.read_text())
    trials = [t for t in report.trials if t.score and t.metrics is not None]
    same_kind = [
        t
        for t in trials
        if t.recipe.transform.quantization.mode != "fp32"
        and t.recipe.transform.quantization.per_channel == olive_per_channel
    ]
    best = max(trials, key=lambda t: t.score or 0.0, default=None)
    closest = max(same_kind, key=lambda t: t.score or 0.0, default=None)
    if best is None or closest is None or closest is best or best.metrics is None or closest.metrics is None:
        return text
    chosen_ms = best.metrics.latency.p50_ms
    other_ms = closest.metrics.latency.p50_ms
    granularity = "per-channel" if olive_per_channel else "per-tensor"
    return (
        f"{text} metainfer's search had measured its chosen variant at {chosen_ms * 1000:.1f} µs and its best "
        f"{granularity} int8 variant (Olive's granularity) at {other_ms * 1000:.1f} µs "
        f"({other_ms / chosen_ms - 1:+.0%}), so its trials and this measurement rank the two granularities "
        "oppositely: at a few microseconds per batch the order is within this shared machine's timing noise, "
        "and the search keeps whichever measured fastest in its own trials."
    )


def render(results: dict[str, Any]) -> str:
    """The section's text from the saved result (bench/records.OlivePeerResult, dumped)."""
    if results.get("olive_unavailable"):
        return render_unavailable(results["olive_unavailable"], results)
    env = results.get("olive_env", {})
    cores = results["machine"]["logical_cores"] if "machine" in results else os.cpu_count()
    intro = (
        f"Olive {env.get('olive', '?')} (olive-ai, from the package registry, in its own virtual environment "
        f"built from `bench/requirements-olive.txt`) and metainfer search the same FP32 ONNX model with the same "
        f"samples, the same accuracy budget (quality drop <= {MAX_DROP} against FP32) and the same number K of "
        f"candidate evaluations: `metainfer adapt --budget-trials K` vs Olive's joint search "
        f"(`OnnxQuantization` with Olive's own default search space, then `OrtSessionParamsTuning` over "
        f"metainfer's optimisation levels, intra-op threads {results['threads']} and execution modes; "
        f"TPE sampler, `max_samples` K, seed {SEED}); one Olive sample is one quantized model with one session "
        f"setting, evaluated for p50 latency (objective, {OLIVE_REPEAT} runs) and the same quality score (goal). "
        f"Olive's tuning pass also times a baseline and the tuned setting inside each sample, so Olive measures "
        f"about three latencies per candidate where metainfer measures one. The searches run one after the "
        f"other. Afterwards every output is measured here with metainfer's code: FP32 with ORT's default "
        f"SessionOptions, Olive's best model with the session options Olive chose, metainfer's variant with its "
        f"recipe's session options; timed in {results['rounds']} alternating rounds, quality on all samples. "
        f"Search wall time is each whole command (`metainfer adapt`, Olive's workflow run), start to exit."
    )
    notes = (
        "Olive needed three things to run here, each recorded in `bench/requirements-olive.txt` or "
        "`bench/olive_peer_driver.py`: olive-ai hard-requires torch, and the registry has only the CUDA build "
        "for Linux (about 3 GiB of CUDA libraries, never loaded on this CPU run); pydantic is pinned to 2.13.5 "
        "because 2.14 breaks Olive's enum validation; and olive-ai 0.13.0 cannot run a custom metric through "
        "its workflow runner (two serializers call `None.model_dump()` and the metric's user config is dropped "
        "when the config is round-tripped), which the driver works around without touching Olive's search, "
        "passes or evaluator."
    )
    load = (
        f"Load average (1 min) at start {results['load_start']}, at end {results['load_end']} on "
        f"{cores} logical cores; other work on the machine slows all three models of a table alike "
        "(interleaved timing) but makes the search wall times noisier."
    )
    parts = [intro, notes, load]
    parts += [render_model(name, result) for name, result in results["models"].items()]
    judged = [r["verdict"] for r in results["models"].values() if r["verdict"] is not None]
    if judged and all(judged):
        overall = "met on every model"
    elif judged:
        overall = "missed on " + ", ".join(n for n, r in results["models"].items() if r["verdict"] is False)
    else:
        overall = "not judged"
    parts.append(
        f"**Target** (adapted variant at least as fast as Olive's at equal or better quality; quality counts as "
        f"equal within {QUALITY_TIE}): {overall}."
    )
    return "\n\n".join(parts)


def render_unavailable(reason: str, results: dict[str, Any]) -> str:
    return (
        "Olive could not be installed or run on this machine, so there is no comparison.\n\n"
        f"Reason: `{reason}`\n\n"
        f"**Target** (adapted variant at least as fast as Olive's at equal or better quality): not judged, "
        f"because Olive did not run. Environment tried: `{results.get('olive_venv')}`."
    )
