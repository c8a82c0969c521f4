"""``metainfer adapt`` of a decoder: the shell around ``core.engine.decoder.adapt`` (sessions, files, the table)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import onnx
from rich.table import Table

from metainfer.agent.commands import console, out
from metainfer.core.engine.decoder import adapt as decoder_adapt
from metainfer.core.engine.decoder.quality import reference_text
from metainfer.core.engine.decoder.signature import DecoderSignature
from metainfer.core.engine.decoder.tokenizer import TextCodec, carried_context, carried_tokenizer
from metainfer.core.engine.decoder.workload import DecoderWorkload, prompt_from_text
from metainfer.core.engine.errors import ModelError, NoFeasibleCandidate
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.runtime import Session, create_session
from metainfer.core.engine.transforms import build_variant

DEFAULT_CONTEXT = 2048


def adapt_decoder(args: argparse.Namespace, model: onnx.ModelProto, base: bytes, signature: DecoderSignature) -> int:
    metadata = {prop.key: prop.value for prop in model.metadata_props}
    codec = decoder_codec(metadata, str(args.model))
    context = args.max_context or carried_context(metadata) or DEFAULT_CONTEXT
    workload = DecoderWorkload(prompt_tokens=args.prompt_tokens, decode_tokens=args.decode_tokens,
                               concurrency=args.concurrency, max_context=context)  # fmt: skip
    if workload.prompt_tokens + workload.decode_tokens > context:
        raise ModelError("--prompt-tokens", f"prompt plus decode tokens ({workload.prompt_tokens} + "
                         f"{workload.decode_tokens}) exceed the context of {context}")  # fmt: skip
    constraints = decoder_adapt.DecoderConstraints(
        ttft_p95_ms=args.slo_ttft_p95_ms, tpot_p95_ms=args.slo_tpot_p95_ms, min_tokens_per_s=args.min_tokens_per_s,
        max_perplexity_rise=args.max_perplexity_rise, max_memory_mib=args.max_memory_mib,
    )  # fmt: skip
    text_ids = codec.encode(reference_text())
    prompt = prompt_from_text(text_ids, workload.prompt_tokens)
    recipes = candidate_recipes(model, signature)
    console.print(f"decoder: {len(signature.layers)} layers, {signature.kv_heads} KV heads of {signature.head_dim}"
                  f" ({signature.form}); {len(recipes)} candidates, measuring up to {args.budget_trials}",
                  highlight=False)  # fmt: skip

    def shown(trial: decoder_adapt.DecoderTrial) -> None:
        console.print(f"  {trial.describe()}", highlight=False)

    report, variant = decoder_adapt.adapt(
        base, signature, text_ids, prompt, workload, constraints, recipes, build_candidate, candidate_session,
        budget=args.budget_trials, on_trial=shown,
    )  # fmt: skip
    written = _write(args.out, report, variant)
    _print_table(report)
    out.print("wrote " + ", ".join(str(p) for p in written))
    if report.shipped is None:
        raise NoFeasibleCandidate("no candidate, FP32 included, meets the decoder's SLOs and memory: "
                                  + report.baseline.reason, closest=[])  # fmt: skip
    return 0


def decoder_codec(metadata: dict[str, str], where: str) -> TextCodec:
    codec = carried_tokenizer(metadata)
    if codec is None:
        raise ModelError(where, "the decoder carries no tokenizer (metadata tokenizer.json): pack the export "
                         "directory's tokenizer files into it with `metainfer llm-pack`")  # fmt: skip
    return codec


def candidate_recipes(model: onnx.ModelProto, signature: DecoderSignature) -> list[Recipe]:
    """The decoder's candidates on this machine: the runtimes it has, its thread counts."""
    return decoder_adapt.candidates(_runtimes(signature), _thread_options(), has_matmul_nbits=True,
                                    nncf=signature.form != "group_query_attention",
                                    logits_matmul=decoder_adapt.logits_projection(model, signature))  # fmt: skip


def build_candidate(base: bytes, recipe: Recipe) -> bytes:
    return build_variant(base, recipe.transform)


def candidate_session(variant: bytes, recipe: Recipe) -> Session:
    return create_session(variant, recipe)


def _runtimes(signature: DecoderSignature) -> list[str]:
    runtimes = ["onnxruntime"]
    if signature.form != "group_query_attention":  # com.microsoft's GroupQueryAttention is ONNX Runtime's own
        try:
            import openvino  # noqa: F401
        except ImportError:
            pass
        else:
            runtimes.append("openvino")
    return runtimes


def _thread_options() -> list[int]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return [0] if cores <= 2 else [0, max(1, cores // 2)]


def _write(out_dir: Path, report: decoder_adapt.DecoderReport, variant: bytes | None) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "decoder-report.json"]
    written[0].write_text(report.model_dump_json(indent=2))
    if report.shipped is not None and variant is not None:
        (out_dir / "variant.onnx").write_bytes(variant)
        (out_dir / "recipe.json").write_text(json.dumps(report.shipped.recipe.model_dump(mode="json"), indent=2))
        written += [out_dir / "variant.onnx", out_dir / "recipe.json"]
    return written


def _print_table(report: decoder_adapt.DecoderReport) -> None:
    table = Table(title=f"decoder candidates ({report.workload.prompt_tokens}-token prompt, "
                        f"{report.workload.decode_tokens} decoded, {report.workload.concurrency} streams)")  # fmt: skip
    for column in ("", "candidate", "TTFT p95", "TPOT p95", "tok/s", f"x{report.workload.concurrency}", "ppl",
                   "agree", "MiB", "status"):  # fmt: skip
        table.add_column(column, overflow="fold", max_width=40 if column == "candidate" else None)
    for index, trial in enumerate(report.trials):
        m, q = trial.measurement, trial.quality
        table.add_row(
            "*" if index == report.best else "", trial.recipe.describe(),
            f"{m.ttft_ms_p95:.1f}" if m else "-", f"{m.tpot_ms_p95:.2f}" if m else "-",
            f"{m.decode_tokens_per_s:.1f}" if m else "-", f"{m.aggregate_tokens_per_s:.1f}" if m else "-",
            f"{q.perplexity_rise:+.2%}" if q else "-", f"{q.next_token_agreement:.1%}" if q else "-",
            f"{trial.memory_mib:.0f}" if m else "-", trial.status,
        )  # fmt: skip
    console.print(table)
    for trial in report.trials:
        if trial.reason:
            console.print(f"{trial.status}: {trial.recipe.describe()}: {trial.reason}", highlight=False)
    shipped = report.shipped
    if shipped is not None and shipped.measurement is not None and report.baseline.measurement is not None:
        base, best = report.baseline.measurement, shipped.measurement
        out.print(f"shipped: {shipped.recipe.describe()}: {best.decode_tokens_per_s:.1f} tok/s "
                  f"({best.decode_tokens_per_s / base.decode_tokens_per_s:.2f}x FP32), "
                  f"{best.aggregate_tokens_per_s:.1f} tok/s with {report.workload.concurrency} streams; "
                  f"{shipped.quality.describe() if shipped.quality else ''}")  # fmt: skip
