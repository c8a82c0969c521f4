"""Peer environments: the virtual environments tests and bench/ run other tools in, one helper for all of them.

A peer (torch's and optimum's exporters, Olive, OpenVINO + NNCF, kserve) pins
its own dependencies, which must never touch the project's environment. Each
has a complete lock, ``bench/requirements-<peer>.txt`` (every package pinned,
installed with ``--no-deps``, so what runs is exactly what was measured), and
gets a venv under ~/.cache/metainfer built from it on first use. The venv is
stamped with the lock's sha256 (and its shared layer's key, below); a venv
whose stamp differs, or that no longer imports its probe modules, is rebuilt.

Shared layers. The exporters' lock (transformers 4.57 + optimum) and Olive's
(transformers 5.24 + Olive) pin the same torch CUDA build with its nvidia-*,
cuda-* and triton wheels, about 3 GiB. The pins two such locks have in common
(same name, same version) are installed once, with
``pip install --no-deps --target``, into ~/.cache/metainfer/peer-layers/<key>
(the key covers those pins and the interpreter they are built for); each venv
holds only its own pins and sees the layer through a ``.pth`` file in its
site-packages that calls ``site.addsitedir`` on it. The layer therefore sits
on sys.path after the venv's own packages: imports, ``importlib.metadata``
and ``pip list``/``pip freeze`` find its packages as if they were installed in
the venv, and a package the venv pins itself always wins. pip and setuptools,
which a fresh venv already holds, are always installed into the venv, so the
lock's version replaces the venv's bundled one as before.

The venvs keep their paths (~/.cache/metainfer/{export,olive,openvino,kserve,tf2onnx,llm}-venv).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"  # the locks stay beside the benchmarks
CACHE = Path.home() / ".cache" / "metainfer"
LAYERS = CACHE / "peer-layers"
STAMP = ".metainfer-lock-sha256"  # in the venv: the lock's sha256 and the layer's key, as JSON
LAYER_STAMP = ".metainfer-layer"  # in a layer: its key, written last, so a half-built layer is never used
PTH = "metainfer-peer-layer.pth"
# What `python -m venv` installs itself: installed into the venv from the lock, never shadowed by a layer.
SEEDED = frozenset({"pip", "setuptools", "wheel"})


class PeerEnvUnavailable(RuntimeError):
    """A peer's venv could not be built or does not import its probe modules; the message says why."""


@dataclass(frozen=True)
class PeerEnv:
    """One peer's venv: where it lives, the lock it is built from, the modules a working one imports."""

    name: str
    venv: Path
    lock: Path
    probe: str = ""  # "torch, transformers": imported to check a venv
    layer_with: tuple[Path, ...] = ()  # locks whose pins in common with ``lock`` share one layer

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


EXPORT_LOCK = BENCH / "requirements-export.txt"
OLIVE_LOCK = BENCH / "requirements-olive.txt"
EXPORT = PeerEnv(
    "transformers-4.57 exporters", CACHE / "export-venv", EXPORT_LOCK, "torch, transformers, onnxscript", (OLIVE_LOCK,)
)
OLIVE = PeerEnv(
    "olive",
    CACHE / "olive-venv",
    OLIVE_LOCK,
    "torch, transformers, onnxscript, onnxruntime, olive.workflows",  # Olive's and the transformers-5 exporters'
    (EXPORT_LOCK,),
)
OPENVINO = PeerEnv(
    "openvino", CACHE / "openvino-venv", BENCH / "requirements-openvino.txt", "openvino, nncf, onnxruntime"
)
KSERVE = PeerEnv("kserve", CACHE / "kserve-venv", BENCH / "requirements-kserve.txt", "kserve, onnxruntime")
TF2ONNX = PeerEnv("tf2onnx", CACHE / "tf2onnx-venv", BENCH / "requirements-tf2onnx.txt", "tensorflow, tf2onnx")
# SmolLM2's exporters (testkit/llm_exports.py): the export lock's pins plus gguf and onnxruntime-genai's builder.
# Layered with both locks above so it sees their one layer (torch and its CUDA libraries), not a second copy.
LLM = PeerEnv(
    "llm exporters",
    CACHE / "llm-venv",
    BENCH / "requirements-llm.txt",
    "torch, transformers, gguf, optimum.exporters.onnx, onnxruntime_genai.models",
    (EXPORT_LOCK, OLIVE_LOCK),
)


@dataclass(frozen=True)
class Ready:
    python: Path
    built_now: bool
    install_s: float = 0.0


# ---------------------------------------------------------------- locks and layers (pure)


def canonical(name: str) -> str:
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, str]:
    """A lock's pins: canonical name -> its line (``name==version``, with a marker if any), comments dropped."""
    pins: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        if line.startswith("-") or "==" not in line:
            raise ValueError(f"not a pin of a complete lock: {raw!r}")
        name = re.split(r"[=<>!~;\[ ]", line, maxsplit=1)[0]
        pins[canonical(name)] = line
    return pins


def _pin_key(line: str) -> str:
    """A pin compared across locks: canonical name, version and marker, spacing ignored."""
    name, rest = line.split("==", 1)
    return canonical(name.split("[", 1)[0]) + "==" + "".join(rest.split())


@dataclass(frozen=True)
class Split:
    shared: tuple[str, ...]  # pin lines every lock of the group has identically: the layer
    own: tuple[str, ...]  # the rest of this lock: the venv


def split(lock_text: str, others: Sequence[str]) -> Split:
    """This lock's pins split into those every other lock pins identically (shared) and the rest (own)."""
    pins = read_pins(lock_text)
    other_keys = [{_pin_key(line) for line in read_pins(t).values()} for t in others]
    shared = tuple(
        line
        for name, line in sorted(pins.items())
        if others and name not in SEEDED and all(_pin_key(line) in keys for keys in other_keys)
    )
    own = tuple(line for _, line in sorted(pins.items()) if line not in shared)
    return Split(shared, own)


def interpreter_tag() -> str:
    """What the wheels of a layer are built for: this interpreter (venvs are made from it) and platform."""
    return f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}"


def layer_key(shared: Sequence[str], tag: str) -> str:
    digest = hashlib.sha256(tag.encode())
    for line in sorted(_pin_key(s) for s in shared):
        digest.update(b"\n" + line.encode())
    return digest.hexdigest()[:24]


@dataclass(frozen=True)
class Plan:
    """How one venv is built: the layer it sees (None: none) and the stamp a venv built this way carries."""

    split: Split
    layer: Path | None
    stamp: dict[str, str | None]


def plan(env: PeerEnv, tag: str | None = None, layers: Path | None = None) -> Plan:
    text = env.lock.read_text()
    parts = split(text, [p.read_text() for p in env.layer_with])
    key = layer_key(parts.shared, tag or interpreter_tag()) if parts.shared else None
    layer = (layers or LAYERS) / key if key else None
    stamp = {"lock_sha256": hashlib.sha256(env.lock.read_bytes()).hexdigest(), "layer": key}
    return Plan(parts, layer, stamp)


def pth_line(layer: Path) -> str:
    """The .pth line that puts a layer on sys.path, its own .pth files processed (addsitedir, as for site-packages)."""
    return f"import site; site.addsitedir({str(layer)!r})\n"


# ---------------------------------------------------------------- building and checking


def subprocess_env(**extra: str) -> dict[str, str]:
    """A peer's processes: this environment less PYTHONPATH and VIRTUAL_ENV, the stdlib not shadowed by operator/."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONSAFEPATH"] = "1"
    env.update(extra)
    return env


def probe_output(python: Path, code: str) -> str | None:
    """What ``code`` prints in that interpreter, or None when it fails (or the interpreter is missing)."""
    if not python.exists():
        return None
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=subprocess_env(), cwd="/")
    return out.stdout.strip() if out.returncode == 0 else None


def _read_stamp(venv: Path) -> object:
    try:
        return json.loads((venv / STAMP).read_text())
    except (OSError, ValueError):
        return None


def _layer_ok(layer: Path | None) -> bool:
    return layer is None or (
        (layer / LAYER_STAMP).is_file() and (layer / LAYER_STAMP).read_text().strip() == layer.name
    )


def check(env: PeerEnv, built: Plan | None = None) -> bool:
    """Whether the venv was built from the lock as it is now, its layer is there, and it imports its probe."""
    built = built or plan(env)
    if _read_stamp(env.venv) != built.stamp or not _layer_ok(built.layer):
        return False
    return probe_output(env.python, f"import {env.probe}" if env.probe else "pass") is not None


def _run(step: list[str]) -> None:
    out = subprocess.run(step, capture_output=True, text=True, env=subprocess_env(), cwd="/")
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-5:]
        raise PeerEnvUnavailable(f"`{' '.join(step)}` failed (exit {out.returncode}): {' | '.join(tail)}")


def _pip_install(python: Path, pins: Sequence[str], *target: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="peer-lock-") as requirements:
        requirements.write("".join(f"{p}\n" for p in pins))
        requirements.flush()
        _run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", *target, "-r", requirements.name])


def ensure_layer(layer: Path, shared: Sequence[str], python: Path) -> None:
    """Install the shared pins into ``layer`` with ``python``'s pip, unless a complete one is there."""
    if _layer_ok(layer):
        return
    print(f"building the shared layer {layer} ({len(shared)} packages) ...", flush=True)
    partial = layer.with_name(f"{layer.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        _pip_install(python, shared, "--target", str(partial))
        (partial / LAYER_STAMP).write_text(layer.name + "\n")
        shutil.rmtree(layer, ignore_errors=True)
        partial.rename(layer)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def build(env: PeerEnv, built: Plan | None = None) -> None:
    """Replace the venv with a fresh one: its own pins installed, the shared layer (built if missing) on its path."""
    built = built or plan(env)
    if env.venv.exists():
        shutil.rmtree(env.venv)
    _run([sys.executable, "-m", "venv", str(env.venv)])  # venv builds on this interpreter's base Python
    if built.layer is not None:
        ensure_layer(built.layer, built.split.shared, env.python)
    _pip_install(env.python, built.split.own)
    if built.layer is not None:
        site = probe_output(env.python, "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        if not site:
            raise PeerEnvUnavailable(f"{env.name}: cannot find the site-packages of {env.venv}")
        (Path(site) / PTH).write_text(pth_line(built.layer))
    (env.venv / STAMP).write_text(json.dumps(built.stamp, sort_keys=True) + "\n")


def ensure(env: PeerEnv) -> Ready:
    """The peer's python: its venv reused when it matches its lock and imports, else (re)built and checked."""
    built = plan(env)
    if check(env, built):
        return Ready(env.python, built_now=False)
    print(f"building the {env.name} environment in {env.venv} from {env.lock.name} ...", flush=True)
    started = time.monotonic()
    build(env, built)
    if env.probe:
        out = subprocess.run(
            [str(env.python), "-c", f"import {env.probe}"], capture_output=True, text=True, env=subprocess_env()
        )
        if out.returncode != 0:
            tail = " | ".join(out.stderr.strip().splitlines()[-3:])
            raise PeerEnvUnavailable(f"{env.name} installed but does not import: {tail}")
    return Ready(env.python, built_now=True, install_s=round(time.monotonic() - started, 1))
