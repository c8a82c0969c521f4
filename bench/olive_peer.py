"""Peer comparison: Microsoft Olive vs metainfer on the same ONNX model, same data, same candidate budget.

Why: to answer whether metainfer's search finds a variant at least as fast
as what Olive (olive-ai, installed from the package registry) finds with its
ONNX quantization pass and its session-parameter tuning pass, at equal or
better quality, and how long each search takes.

How:

1. Olive runs in its own virtual environment (``--olive-venv``, built from
   bench/requirements-olive.txt when missing by testkit/peer_env.py), so its
   pins (torch, transformers, ...) never touch the project's environment.
2. Both searches get the same FP32 model, the same NPZ samples, the same
   accuracy budget (quality drop <= 0.01 against FP32) and the same number of
   candidate evaluations K: metainfer's ``--budget-trials K`` and Olive's joint
   search with ``max_iter K`` (one sample = one quantization config plus one
   session-parameter setting, evaluated for latency and quality). Olive's
   search space is its own passes restricted to the knobs metainfer also
   searches (dynamic/static int8, per-channel, weight and activation types,
   calibration method; optimisation level, intra-op threads, execution mode).
3. The searches run one after the other, never together. Then every output is
   measured again here with metainfer's code (core.engine.evaluate): FP32 with
   default SessionOptions, Olive's model with the session options Olive chose,
   metainfer's variant with its recipe's session options, timed in alternating
   rounds so background load hits all three alike; quality against FP32 on all
   samples (top-1 with labels, mean-pooled cosine for a transformer).

    PYTHONSAFEPATH=1 .venv/bin/python bench/olive_peer.py [--quick]

``--quick``: bert_mini only, K=4, fewer timing rounds (about 5 minutes on an
idle 2-core machine once the Olive environment exists; 10 under heavy load).
Without it: bert_mini and digits, K=24 (Olive needs about 30-90 s per
bert_mini candidate here, so plan most of an hour).

Olive's sampler counts a suggestion its own search space rules invalid (for
example QOperator with int8 activations) against ``max_samples`` without
evaluating it, so Olive may evaluate fewer than K candidates; the table says
how many it did.

This script only drives the run; each concern has its module: testkit/peer_env.py
(Olive's venv), bench/olive_workflow.py (Olive's run config),
bench/olive_search.py (running both searches), bench/olive_output.py (reading
Olive's output), bench/olive_measure.py (the independent measurement) and
bench/olive_report.py (verdict and section text).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import benchlib
from bench.olive_measure import load_dataset, measure, write_olive_reference
from bench.olive_report import verdict, why_slower
from bench.olive_search import DEFAULT_VENV, OliveUnavailable, ensure_olive, run_metainfer, run_olive
from bench.olive_workflow import MAX_DROP, SEED, olive_workflow, thread_choices
from metainfer.agent.zoo.build import build_examples

TITLE = "Peer comparison: Microsoft Olive"
# Production batch per example model (the batch both searches optimise for).
BATCHES = {"bert_mini": 8, "digits": 64}


def _load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="bert_mini only, K=4, short timing")
    parser.add_argument("--models", nargs="+", choices=sorted(BATCHES), help="default: bert_mini digits")
    parser.add_argument("--budget", type=int, help="K, candidate evaluations per search (default 24, quick 4)")
    parser.add_argument("--rounds", type=int, help="alternating timing rounds (default 10, quick 5)")
    parser.add_argument("--seconds", type=float, help="timing seconds per model per round (default 2, quick 1)")
    parser.add_argument("--olive-venv", type=Path, default=DEFAULT_VENV, help=f"default {DEFAULT_VENV}")
    parser.add_argument("--work", type=Path, help="keep models, configs and logs here (default: a temp dir)")
    parser.add_argument("--timeout-s", type=float, default=3600, help="limit for each search")
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="rewrite the section from bench/results/olive_peer.json (same as python -m bench.render)",
    )
    args = parser.parse_args(argv)
    if args.render_only:
        saved = json.loads((benchlib.RESULTS / "olive_peer.json").read_text())
        data = {k: v for k, v in saved.items() if k not in ("benchmark", "command", "machine")}
        benchlib.write_result("olive_peer", TITLE, data, saved["command"], saved["machine"])
        return 0
    models = args.models or (["bert_mini"] if args.quick else ["bert_mini", "digits"])
    budget = args.budget or (4 if args.quick else 24)
    rounds = args.rounds or (5 if args.quick else 10)
    seconds = args.seconds or (1.0 if args.quick else 2.0)
    work = args.work or Path(tempfile.mkdtemp(prefix="olive_peer_"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "quick": args.quick,
        "budget": budget,
        "rounds": rounds,
        "max_accuracy_drop": MAX_DROP,
        "seed": SEED,
        "threads": thread_choices(),
        "olive_venv": str(args.olive_venv),
        "work": str(work),
        "load_start": _load(),
        "models": {},
    }
    try:
        results["olive_env"] = ensure_olive(args.olive_venv)
    except OliveUnavailable as exc:
        print(f"Olive unavailable: {exc}", file=sys.stderr)
        results["olive_unavailable"] = str(exc)
        benchlib.write_result("olive_peer", TITLE, results)
        return 1
    print(f"Olive {results['olive_env']['olive']} in {args.olive_venv}; work dir {work}", flush=True)
    examples = build_examples(work / "examples", models)
    for name in models:
        example, batch = examples[name], BATCHES[name]
        model_work = work / name
        model_work.mkdir(parents=True, exist_ok=True)
        reference = model_work / "olive_reference.npz"
        write_olive_reference(example, load_dataset(example), batch, reference)
        config = olive_workflow(example, batch, budget, reference, model_work / "olive", results["threads"])
        print(f"[{name}] Olive search, K={budget} ...", flush=True)
        olive = run_olive(args.olive_venv, config, model_work / "olive", args.timeout_s)
        print(f"[{name}] Olive: {olive.wall_s:.0f} s {olive.error or ''}", flush=True)
        print(f"[{name}] metainfer search, K={budget} ...", flush=True)
        ours = run_metainfer(example, batch, budget, model_work, args.timeout_s)
        print(f"[{name}] metainfer: {ours.wall_s:.0f} s {ours.error or ''}", flush=True)
        rows = measure(example, batch, [olive, ours], rounds, seconds)
        met, text = verdict(rows)
        for r in rows:
            print(f"[{name}] {r.name:<28} p50 {r.p50_ms:8.1f} ms  p95 {r.p95_ms:8.1f} ms  quality {r.quality:.4f}")
        print(f"[{name}] {text}", flush=True)
        results["models"][name] = {
            "batch": batch,
            "samples": example.samples,
            "budget": budget,
            "measured": [r.__dict__ for r in rows],
            "olive": {k: v for k, v in olive.__dict__.items() if k != "tool"},
            "metainfer": {k: v for k, v in ours.__dict__.items() if k != "tool"},
            "verdict": met,
            "verdict_text": text,
            # Kept in the result: it reads metainfer's report.json in the work dir, which is temporary.
            "why": why_slower(rows, {"model_path": str(ours.model_path or "")}) if met is False else None,
        }
        # Written after each model, so a long run that is stopped still leaves the models it finished.
        results["load_end"] = _load()
        benchlib.write_result("olive_peer", TITLE, results)
    print(f"wrote bench/results/olive_peer.json and BENCHMARKS.md; work dir {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
