"""The folder -> import-name mapping is complete and nothing shadows the stdlib's operator."""

from __future__ import annotations

import operator as stdlib_operator
import re
import tomllib
from pathlib import Path

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
        for folder in (*MAPPING, "tests", "hack", "bench")
        if (ROOT / folder).exists()
        for p in (ROOT / folder).rglob("*.py")
        if pattern.search(p.read_text())
    ]
    assert not offenders, f"these import 'operator.<x>'; use metainfer.operator: {offenders}"


def test_the_operator_does_not_load_the_inference_stack() -> None:
    """onnx, onnxruntime and numpy cost the operator ~40 MB of RSS it never uses (it only reads profile types)."""
    import subprocess
    import sys

    code = (
        "import sys, metainfer.operator.handlers, metainfer.operator.main\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} & {'onnx', 'onnxruntime', 'numpy', 'skopt'})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the operator imported {out.stdout.strip()}"
