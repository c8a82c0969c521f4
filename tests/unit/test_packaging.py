"""The folder -> import-name mapping is complete and nothing shadows the stdlib's operator."""

from __future__ import annotations

import ast
import json
import operator as stdlib_operator
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import IO

import pytest

import metainfer.operator

ROOT = Path(__file__).resolve().parents[2]
MAPPING = {"core": "metainfer.core", "agent": "metainfer.agent", "operator": "metainfer.operator"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_subpackage_is_listed() -> None:
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = set()
    for folder, name in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    missing = sorted(found - listed)
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {missing}"
    assert not sorted(listed - found), "pyproject lists packages that do not exist"


def test_package_dir_maps_the_fixed_layout() -> None:
    mapping = _pyproject()["tool"]["setuptools"]["package-dir"]
    assert mapping == {name: folder for folder, name in MAPPING.items()}


def test_stdlib_operator_is_not_shadowed() -> None:
    assert stdlib_operator.eq(1, 1)
    assert Path(stdlib_operator.__file__ or "").name == "operator.py"
    assert Path(metainfer.operator.__file__ or "").parent == ROOT / "operator"


def test_no_code_imports_a_top_level_operator_package() -> None:
    pattern = re.compile(r"^\s*(from\s+operator\.|import\s+operator\.)", re.MULTILINE)
    offenders = [
        str(p.relative_to(ROOT))
        for folder in (*MAPPING, "tests", "hack", "bench", "testkit")
        if (ROOT / folder).exists()
        for p in (ROOT / folder).rglob("*.py")
        if pattern.search(p.read_text())
    ]
    assert not offenders, f"these import 'operator.<x>'; use metainfer.operator: {offenders}"


# What a model run needs and the operator never does: together ~30 MB of the operator's RSS.
INFERENCE_STACK = {"onnx", "onnxruntime", "numpy", "scipy", "sklearn", "skopt", "matplotlib"}
STARTUP_DEADLINE_S = 60.0


def _startup_handlers() -> set[str]:
    """The names of the operator's ``@kopf.on.startup()`` handlers, read from the source (importing them would
    register them in this process)."""
    names = set()
    for path in (ROOT / "operator").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                ast.unparse(d).startswith("kopf.on.startup") for d in node.decorator_list
            ):
                names.add(node.name)
    return names


def _unreachable_kubeconfig(path: Path, port: int) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "unused"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def _pump(stream: IO[str], into: queue.Queue[str | None]) -> None:
    for line in stream:
        into.put(line)
    into.put(None)


def test_metainfer_operator_does_not_load_the_inference_stack(tmp_path: Path) -> None:
    """The chart runs exactly ``metainfer operator``: start that command and let it import everything up to and
    including its startup handlers, then read Python's verbose import log (``-X importtime`` would miss modules
    loaded with ``importlib.import_module``, as the handlers module is).

    The API server is a port bound here but never listened on, so every request is refused at once and kopf runs
    each startup handler (one fails and is retried in a minute, the others finish) without a cluster.
    """
    script = Path(sys.executable).parent / "metainfer"
    # The console script pip writes is exactly this; an environment without it (no install) runs the same code.
    command = (
        [str(script)]
        if script.is_file()
        else [sys.executable, "-c", "import sys; from metainfer.agent.cli import main; sys.exit(main())"]
    )
    expected = _startup_handlers()
    assert expected, "no @kopf.on.startup handlers found under operator/"
    invoked: set[str] = set()
    imported: set[str] = set()
    lines: queue.Queue[str | None] = queue.Queue()
    with socket.socket() as refusing:
        refusing.bind(("127.0.0.1", 0))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "METAINFER_", "PYTHONVERBOSE"))}
        env.update(
            KUBECONFIG=str(_unreachable_kubeconfig(tmp_path / "kubeconfig", refusing.getsockname()[1])),
            PYTHONVERBOSE="1",
        )
        proc = subprocess.Popen(
            [*command, "operator", "--standalone", "--liveness", "", "--verbose"],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stderr is not None
        # A thread reads, so that the wait below has a deadline even when the process hangs without a word.
        threading.Thread(target=_pump, args=(proc.stderr, lines), daemon=True).start()
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        try:
            while not expected <= invoked:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                if line is None:
                    pytest.fail(f"`metainfer operator` exited ({proc.wait()}) before its startup handlers ran")
                if match := re.match(r"import '([\w.]+)' #", line):
                    imported.add(match[1])
                elif match := re.search(r"Activity '(\w+)' is invoked", line):
                    invoked.add(match[1])
        except queue.Empty:
            pytest.fail(f"startup handlers not invoked within {STARTUP_DEADLINE_S:g}s: {sorted(expected - invoked)}")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert "metainfer.operator.handlers" in imported, "the import log does not show the handlers module"
    loaded = sorted({name.split(".")[0] for name in imported} & INFERENCE_STACK)
    assert not loaded, f"`metainfer operator` imported {loaded}"
