"""BENCHMARKS.md from the saved results: each section rendered from its typed record.

    PYTHONSAFEPATH=1 .venv/bin/python -m bench.render     # rewrite BENCHMARKS.md from bench/results/*.json

A section is a frame (title, the command, the machine line, the raw results'
path) around a body its benchmark's render function writes from the record
(bench/records.py); hand-written prose lives with that function, as a
template or as data in its module (EXPLANATIONS, docstrings). No benchmark
writes markdown. Sections are ordered as ``benchlib.SECTIONS`` says, a name
not listed last.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import benchlib, records

PREAMBLE = (
    "# Benchmarks\n\n"
    "Every number below was produced by the command shown in its section on the machine it names; "
    "`make bench` reruns all of them quickly, `make bench-<name>` one of them in full. "
    "Targets are the product's claims; where one is missed, its section says so and why. "
    "Sections are rendered from the benchmarks' saved results (bench/results/*.json) by `python -m bench.render`, "
    "never edited by hand.\n\n"
    "Sections measured before commit ab73106 used the earlier example models: since then "
    "`metainfer examples build` makes digits and bert_mini in integer arithmetic, so that the sha256 the "
    "example policies pin holds on every machine (same architectures and graph patterns, new weights and data; "
    "digits is trained in fixed point, 98.05 % top-1 on its 359 held-out images, where the earlier "
    "sklearn-trained MLP had 98.06 % on 360). Each section names the commit it was measured at.\n"
)


@dataclass(frozen=True)
class Section:
    title: str
    record: type[records.Record]
    body: Callable[[Any], str]  # the validated record -> the section's markdown between machine line and raw path


def _adaptation(r: records.AdaptationResult) -> str:
    from bench import adaptation

    return adaptation.render(r.model_dump())


def _warm_start(r: records.WarmStartResult) -> str:
    from bench import warm_start

    return warm_start.render(r.model_dump(by_alias=True))


def _serving(r: records.ServingResult) -> str:
    from bench import serving

    return serving.render(r.model_dump())


def _search_efficiency(r: records.SearchEfficiencyResult) -> str:
    from bench import search_efficiency

    return search_efficiency.render(r.model_dump())


def _export_matrix(r: records.MatrixResult) -> str:
    from bench import export_matrix

    return export_matrix.render(r.rows, r.trials, export_matrix.EXPLANATIONS)


def _cnn_matrix(r: records.MatrixResult) -> str:
    from bench import cnn_matrix

    return cnn_matrix.render(r.rows, r.trials, cnn_matrix.EXPLANATIONS)


def _operator_scale(r: records.OperatorScaleResult) -> str:
    from bench import operator_scale

    body = operator_scale.render(r.points, r.quick, r.load, r.gpu_resource_workaround, r.profile)
    if r.rerendered:
        body += f"\n\nMeasured {r.machine.date} at commit {r.machine.commit}; only the text was re-rendered since."
        if r.note:
            body += f" {r.note}"
    return body


def _olive_peer(r: records.OlivePeerResult) -> str:
    from bench import olive_report

    return olive_report.render(r.model_dump())


def _pod_start(r: records.PodStartResult) -> str:
    from bench import pod_start

    return pod_start.render(r.model_dump())


def _continuity(r: records.ContinuityResult) -> str:
    from bench import continuity

    return continuity.render(r.model_dump())


def _real_node(r: records.RealNodeResult) -> str:
    from bench import real_node

    return real_node.render(r.model_dump())


def _runtime_choice(r: records.RuntimeChoiceResult) -> str:
    from bench import runtime_choice

    return runtime_choice.render(r.model_dump())


def _ocr_matrix(r: records.RuntimeChoiceResult) -> str:
    from bench import ocr_matrix

    return ocr_matrix.render(r.model_dump())


def _graph_levers(r: records.GraphLeversResult) -> str:
    from bench import graph_levers

    return graph_levers.render(r.model_dump())


def _weights(r: records.WeightsResult) -> str:
    from bench import weights

    return weights.render(r.model_dump())


def _llm_peers(r: records.LlmPeersResult) -> str:
    from bench import llm_peers

    return llm_peers.render(r.model_dump())


# Titles are data: the one place a section's heading is written.
SECTIONS: dict[str, Section] = {
    "adaptation": Section("Adaptation quality", records.AdaptationResult, _adaptation),
    "export_matrix": Section(
        "Adaptation on models as users export them (export matrix)", records.MatrixResult, _export_matrix
    ),
    "cnn_matrix": Section("Conv nets at batch 1 (CNN matrix)", records.MatrixResult, _cnn_matrix),
    "runtime_choice": Section(
        "Runtime choice: ONNX Runtime or OpenVINO, per model", records.RuntimeChoiceResult, _runtime_choice
    ),
    "ocr_matrix": Section(
        "Models from other exporters: PP-OCRv4 (paddle2onnx), ddddocr (PyTorch)",
        records.RuntimeChoiceResult,
        _ocr_matrix,
    ),
    "graph_levers": Section(
        "Graph levers: spelled-out activations as one operator", records.GraphLeversResult, _graph_levers
    ),
    "weights": Section("Low-bit weights and memory budgets", records.WeightsResult, _weights),
    "llm_peers": Section(
        "Decoder LLMs: SmolLM2 on llama.cpp, ONNX Runtime GenAI, OpenVINO GenAI and metainfer",
        records.LlmPeersResult,
        _llm_peers,
    ),
    "search_efficiency": Section("Search efficiency", records.SearchEfficiencyResult, _search_efficiency),
    "warm_start": Section("Warm start across hardware classes", records.WarmStartResult, _warm_start),
    "operator_scale": Section("Operator scale on the real control plane", records.OperatorScaleResult, _operator_scale),
    "olive_peer": Section("Peer comparison: Microsoft Olive", records.OlivePeerResult, _olive_peer),
    "serving": Section(
        "Serving: side by side with ONNX Runtime and kserve, dynamic batching, liveness",
        records.ServingResult,
        _serving,
    ),
    "pod_start": Section("Serving: pod start, rebuild vs variant store", records.PodStartResult, _pod_start),
    "real_node": Section(
        "Real node: cluster-up, image, apply to Ready, drift to canary", records.RealNodeResult, _real_node
    ),
    "continuity": Section(
        "Continuity: a client's view while hardware, models and the operator change",
        records.ContinuityResult,
        _continuity,
    ),
}


def load(name: str, results: Path | None = None) -> records.Record:
    """The saved result of a section, validated."""
    path = (results or benchlib.RESULTS) / f"{name}.json"
    return SECTIONS[name].record.model_validate_json(path.read_text())


def section(name: str, results: Path | None = None) -> str:
    """One section's markdown (ending in a newline), from its JSON."""
    record = load(name, results)
    parts = [
        f"## {SECTIONS[name].title}",
        f"Command: `{benchlib.retypeable(record.command)}`",
        benchlib.machine_line(record.machine.model_dump()),
        SECTIONS[name].body(record).strip(),
        f"Raw results: `bench/results/{name}.json`.",
    ]
    return "\n\n".join(parts) + "\n"


def present(results: Path | None = None) -> list[str]:
    """The sections that have a saved result, in BENCHMARKS.md's order."""
    results = results or benchlib.RESULTS
    names = {n for n in SECTIONS if (results / f"{n}.json").exists()}
    order = benchlib.SECTIONS
    return sorted(names, key=lambda n: (order.index(n) if n in order else 99, n))


def benchmarks_md(results: Path | None = None) -> str:
    return PREAMBLE + "".join("\n" + section(name, results) for name in present(results))


def main() -> int:
    benchlib.BENCHMARKS_MD.write_text(benchmarks_md())
    print(f"wrote {benchlib.BENCHMARKS_MD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
