"""Run every benchmark, one after another, so none disturbs another's timings.

    PYTHONSAFEPATH=1 .venv/bin/python bench/run_all.py [--quick] [--only NAME ...]

``--quick`` passes each benchmark its own quick mode (fewer models, seeds and
repetitions; minutes instead of an hour). Each one still writes its results and
its BENCHMARKS.md section. Exits non-zero when any benchmark failed, after
running the others.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import benchlib

BENCH_DIR = Path(__file__).resolve().parent
# One script per BENCHMARKS.md section, run in the section order.
BENCHMARKS = benchlib.SECTIONS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's quick mode")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, help="run just these")
    args = parser.parse_args(argv)
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    failed = []
    for name in args.only or BENCHMARKS:
        command = [sys.executable, str(BENCH_DIR / f"{name}.py"), *(["--quick"] if args.quick else [])]
        print(f"== {name}: {' '.join(command)}", flush=True)
        started = time.monotonic()
        code = subprocess.call(command, env=env)
        print(f"== {name}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
        if code:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
