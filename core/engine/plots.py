"""The latency/quality picture of a search: where every trial landed.

Latency is on a log axis: a search's trials span orders of magnitude (one
pathological candidate, emulated fp16 say, can be 50x slower), and on a linear
axis that one point squashes every other into a sliver at the left. On a log
axis equal ratios are equal distances, which is how speedups are read.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from metainfer.core.engine.report import Report
from metainfer.core.engine.trial import Trial, TrialStatus


def _xy(trials: list[Trial]) -> tuple[list[float], list[float]]:
    done = [t.metrics for t in trials if t.metrics is not None]
    return [m.latency.p95_ms for m in done], [m.quality.value for m in done]


def pareto_plot(report: Report, path: Path) -> None:
    fig = pareto_figure(report)
    fig.savefig(path)
    plt.close(fig)


def pareto_figure(report: Report) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.set_xscale("log")
    latencies, _ = _xy([report.baseline, *report.trials])
    spread = max(latencies) / max(min(latencies), 1e-12) if latencies else 1.0
    # Plain numbers, not 1e-02. Within about a decade the decades' own ticks are off the data, so the
    # minor ticks between them carry the labels; over more, only the 2s and 5s, or they would pile up.

    def minor_label(value: float, _: object) -> str:
        leading = round(value / 10 ** math.floor(math.log10(value))) if value > 0 else 0
        if spread < 30 or (spread < 1000 and leading in (2, 5)):
            return f"{value:.3g}"
        return ""

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(minor_label))
    feasible = [t for t in report.trials if t.status == TrialStatus.FEASIBLE]
    infeasible = [t for t in report.trials if t.status == TrialStatus.INFEASIBLE]
    for trials, marker, color, label in (
        (infeasible, "x", "tab:red", "infeasible"),
        (feasible, "o", "tab:blue", "feasible"),
    ):
        if trials:
            x, y = _xy(trials)
            ax.scatter(x, y, marker=marker, color=color, alpha=0.7, label=f"{label} ({len(trials)})")
    x, y = _xy([report.baseline])
    ax.scatter(x, y, marker="s", s=90, color="black", label="FP32 baseline (ORT defaults)", zorder=5)
    if report.best is not None:
        x, y = _xy([report.best])
        ax.scatter(x, y, marker="*", s=260, color="gold", edgecolor="black", label="chosen", zorder=6)
    c = report.settings.constraints
    metric = report.baseline.metrics.quality.metric if report.baseline.metrics else "quality"
    if report.baseline.metrics is not None:
        floor = report.baseline.metrics.quality.reference - c.max_quality_drop
        ax.axhline(floor, color="grey", linestyle="--", linewidth=1, label=f"quality budget ({floor:.3f})")
    if c.slo_p95_ms is not None:
        ax.axvline(c.slo_p95_ms, color="grey", linestyle=":", linewidth=1, label=f"p95 SLO ({c.slo_p95_ms:g} ms)")
    ax.set_xlabel(f"p95 latency per batch of {report.settings.batch} (ms, log scale)")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title(f"{Path(report.model.path).name}: {len(report.trials)} trials ({report.settings.algorithm})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig
