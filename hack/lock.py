#!/usr/bin/env python3
"""`make lock`: the image's dependency locks, one per runtime flavour, resolved from pyproject.toml with hashes.

    PYTHONSAFEPATH=1 .venv/bin/python hack/lock.py [--flavour NAME ...] [--check]

Each ``locks/<flavour>.txt`` pins every package the image installs (the project's
``[project] dependencies`` with ``onnxruntime`` swapped for the flavour's ONNX Runtime
distribution) to one version and the sha256 of each of its files, so two builds of one
commit install byte-identical wheels (the Dockerfile installs with ``--require-hashes``).
uv resolves for the image's interpreter and platform (CPython 3.11, x86_64 glibc), not the
host's. The first line records a digest of what the lock was resolved from;
tests/unit/test_locks.py fails when pyproject.toml changes without a new lock.

A flavour not declared here (ROCm's wheels live on AMD's own package index) is locked with
``--flavour NAME --package DIST --index-url URL`` and built with ``--build-arg RUNTIME=NAME``.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "locks"
PYTHON_VERSION = "3.11"
# The oldest glibc among the images' bases (Debian bookworm has 2.36): wheels for it install on all of them.
PLATFORM = "x86_64-manylinux_2_28"
RUNTIME_DISTRIBUTION = "onnxruntime"
FLAVOUR_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
_HEADER = re.compile(
    r"^# metainfer lock: flavour (?P<flavour>\S+), runtime (?P<package>\S+), inputs sha256 (?P<digest>[0-9a-f]{64})$"
)


@dataclass(frozen=True)
class Flavour:
    name: str
    package: str  # the ONNX Runtime distribution (with extras) that replaces `onnxruntime`
    index_url: str | None = None


FLAVOURS = (
    Flavour("cpu", "onnxruntime"),
    # CUDA and cuDNN as pip wheels; the driver comes from the node (NVIDIA container toolkit).
    Flavour("cuda", "onnxruntime-gpu[cuda,cudnn]"),
    # Intel's build of ONNX Runtime with the OpenVINO EP compiled in.
    Flavour("openvino", "onnxruntime-openvino"),
)


class LockError(RuntimeError):
    pass


def project_dependencies(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def distribution_name(requirement: str) -> str:
    """The normalised distribution name of a requirement string (PEP 503)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise LockError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def flavour_inputs(flavour: Flavour, dependencies: list[str]) -> list[str]:
    """pyproject's dependencies with the ONNX Runtime distribution replaced by the flavour's."""
    runtime = [d for d in dependencies if distribution_name(d) == RUNTIME_DISTRIBUTION]
    if len(runtime) != 1:
        raise LockError(f"pyproject.toml must declare {RUNTIME_DISTRIBUTION} exactly once, found {runtime}")
    if flavour.package == RUNTIME_DISTRIBUTION:
        return list(dependencies)
    return [flavour.package if distribution_name(d) == RUNTIME_DISTRIBUTION else d for d in dependencies]


def inputs_digest(flavour: Flavour, dependencies: list[str]) -> str:
    text = "\n".join([f"python {PYTHON_VERSION}", f"platform {PLATFORM}", *flavour_inputs(flavour, dependencies)])
    return hashlib.sha256(text.encode()).hexdigest()


def header(flavour: Flavour, dependencies: list[str]) -> str:
    return (
        f"# metainfer lock: flavour {flavour.name}, runtime {flavour.package.replace(' ', '')}, "
        f"inputs sha256 {inputs_digest(flavour, dependencies)}\n"
        "# Generated from pyproject.toml by `make lock` (hack/lock.py); do not edit. The image installs it with\n"
        "# pip install --require-hashes (Dockerfile, --build-arg RUNTIME=<flavour>).\n"
    )


def read_header(lock_text: str) -> dict[str, str]:
    first = lock_text.split("\n", 1)[0]
    match = _HEADER.match(first)
    if match is None:
        raise LockError(f"not a metainfer lock (first line {first[:120]!r}): regenerate it with `make lock`")
    return match.groupdict()


def resolve(flavour: Flavour, dependencies: list[str], uv: Path) -> str:
    """The lock text for ``flavour``: uv's resolution with hashes, under our header."""
    cmd = [
        str(uv), "pip", "compile", "-", "--generate-hashes", "--quiet", "--no-header",
        "--python-version", PYTHON_VERSION, "--python-platform", PLATFORM,
    ]  # fmt: skip
    if flavour.index_url:
        cmd += ["--extra-index-url", flavour.index_url]
    stdin = "\n".join(flavour_inputs(flavour, dependencies)) + "\n"
    # The current lock is uv's output file, so uv keeps its pins where they still satisfy the inputs: adding one
    # dependency changes that dependency's lines, not every package a newer release of which came out since.
    with tempfile.TemporaryDirectory(prefix="metainfer-lock-") as tmp:
        output = Path(tmp, f"{flavour.name}.txt")
        current = LOCKS / f"{flavour.name}.txt"
        if current.exists():
            output.write_text(current.read_text())
        result = subprocess.run([*cmd, "--output-file", str(output)], input=stdin, capture_output=True, text=True,
                                check=False)  # fmt: skip
        if result.returncode != 0:
            raise LockError(f"uv could not resolve the {flavour.name} flavour:\n{result.stderr[-2000:]}")
        return header(flavour, dependencies) + output.read_text()


def _uv() -> Path:
    found = Path(sys.executable).with_name("uv")
    if not found.exists():
        raise LockError(f"uv is not in {found.parent}: `make venv` installs it (the dev extra)")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flavour", action="append", help="only these flavours (default: every declared one)")
    parser.add_argument("--package", help="an undeclared flavour's ONNX Runtime distribution")
    parser.add_argument("--index-url", help="an extra package index for an undeclared flavour")
    parser.add_argument("--check", action="store_true", help="fail if a lock is out of date instead of writing")
    args = parser.parse_args(argv)
    flavours = list(FLAVOURS)
    if args.package:
        if not args.flavour or len(args.flavour) != 1:
            parser.error("--package needs exactly one --flavour NAME")
        if not FLAVOUR_NAME.match(args.flavour[0]):
            parser.error(f"--flavour {args.flavour[0]!r}: lower-case letters, digits, dots and dashes only")
        flavours = [Flavour(args.flavour[0], args.package, args.index_url)]
    elif args.flavour:
        unknown = set(args.flavour) - {f.name for f in FLAVOURS}
        if unknown:
            parser.error(f"unknown flavour(s) {sorted(unknown)}; declared: {[f.name for f in FLAVOURS]}")
        flavours = [f for f in FLAVOURS if f.name in args.flavour]
    dependencies = project_dependencies()
    stale = []
    try:
        for flavour in flavours:
            path = LOCKS / f"{flavour.name}.txt"
            if args.check:
                current = path.read_text() if path.exists() else ""
                if not current.startswith(header(flavour, dependencies)):
                    stale.append(str(path.relative_to(REPO)))
                continue
            path.parent.mkdir(exist_ok=True)
            path.write_text(resolve(flavour, dependencies, _uv()))
            print(f"wrote {path.relative_to(REPO)}")
    except LockError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if stale:
        print(f"out of date (run `make lock`): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


def pins(lock_text: str) -> dict[str, tuple[str, list[str]]]:
    """``{distribution: (version, [sha256, ...])}`` of a lock; anything but ``name==version`` with hashes is refused."""
    found: dict[str, tuple[str, list[str]]] = {}
    for block in re.split(r"\n(?=\S)", lock_text):
        lines = [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
        if not lines:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+) \\", lines[0])
        if match is None:
            raise LockError(f"not an exact pin: {lines[0]!r}")
        hashes = [h for line in lines[1:] for h in re.findall(r"--hash=sha256:([0-9a-f]{64})", line)]
        if not hashes:
            raise LockError(f"{match[1]}=={match[3]} has no sha256 hash")
        found[distribution_name(match[1])] = (match[3], hashes)
    return found
