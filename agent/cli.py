"""The ``metainfer`` command: one entry point for every role.

Subcommands import their machinery lazily so ``metainfer --help`` stays fast
and a node running only the agent never imports kopf.

Exit codes: 0 success, 2 bad input (one line naming the problem), 3 no
feasible candidate (the closest candidates and what each missed).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from metainfer.core.engine.algorithms import ALGORITHM_NAMES, DEFAULT_ALGORITHM
from metainfer.core.engine.errors import InputError, MetainferError, NoFeasibleCandidate

EXIT_INPUT, EXIT_INFEASIBLE = 2, 3


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line naming the flag, exit 2 (the same contract as bad input files)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INPUT, f"metainfer: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="metainfer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("profile", help="measure this machine's hardware profile")
    p.add_argument("--out", type=Path, help="also write the profile JSON here")
    p.add_argument("--refresh", action="store_true", help="ignore the cached profile and measure again")

    a = sub.add_parser("adapt", help="adapt an ONNX model to this machine")
    a.add_argument("model", type=Path, help="the FP32 ONNX model")
    a.add_argument("--data", type=Path, required=True, help="NPZ: arrays named after the inputs [+ labels]")
    a.add_argument("--batch", type=_positive_int, default=1, help="production batch size (default 1)")
    a.add_argument("--search-batch", action="store_true", help="also search the batch size")
    a.add_argument("--slo-p95-ms", type=_positive_float, help="p95 latency SLO per batch, ms")
    a.add_argument(
        "--max-accuracy-drop",
        type=_fraction,
        default=0.01,
        help="largest quality drop vs FP32 (top-1 points as a fraction, or 1-cosine); default 0.01",
    )
    a.add_argument("--max-memory-mib", type=_positive_float, help="peak memory limit, MiB")
    a.add_argument("--budget-trials", type=_positive_int, default=24, help="candidates to measure (default 24)")
    a.add_argument("--time-budget-s", type=_positive_float, help="stop searching after this many seconds")
    a.add_argument("--algorithm", choices=ALGORITHM_NAMES, default=DEFAULT_ALGORITHM)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--out", type=Path, required=True, help="output directory")

    e = sub.add_parser("examples", help="build the bundled example models")
    e.add_argument("action", choices=["build"])
    e.add_argument("out", type=Path)
    e.add_argument("--only", nargs="*", help="names to build (default: digits and the transformer)")

    o = sub.add_parser("operator", help="run the Kubernetes operator (kopf)")
    o.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        help="watch only this namespace (repeatable); default: all namespaces",
    )
    o.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="kopf liveness endpoint (default %(default)s; empty to disable)",
    )
    o.add_argument("--standalone", action="store_true", help="no peering: for a single local operator only")
    o.add_argument("--verbose", action="store_true")

    s = sub.add_parser("serve", help="serve an adapted variant over the KServe v2 / Open Inference Protocol REST API")
    from metainfer.agent.serve.flags import add_arguments as add_serve_arguments

    add_serve_arguments(s)

    g = sub.add_parser("agent", help="node-side roles run by the operator's Jobs")
    gsub = g.add_subparsers(dest="agent_command", required=True, metavar="ROLE", parser_class=_Parser)
    gr = gsub.add_parser("run", help="execute one AdaptationRun and write its status (the adaptation Job)")
    gr.add_argument("run", metavar="NAMESPACE/RUN", help="the AdaptationRun to execute")
    gr.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, else $KUBECONFIG)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_onnxruntime()
    try:
        if args.command == "profile":
            from metainfer.agent.commands import profile_command

            return profile_command(args.out, args.refresh)
        if args.command == "adapt":
            from metainfer.agent.commands import adapt_command

            return adapt_command(args)
        if args.command == "examples":
            from metainfer.agent.commands import examples_command

            return examples_command(args.out, args.only)
        if args.command == "operator":
            from metainfer.operator.main import run as run_operator

            return run_operator(args.namespaces, args.liveness or None, args.standalone, args.verbose)
        if args.command == "serve":
            from metainfer.agent.serve.command import serve_command

            return serve_command(args)
        if args.command == "agent":
            from metainfer.agent.run import run_command

            return run_command(args.run, args.kubeconfig)
    except NoFeasibleCandidate as exc:
        print(f"metainfer: no feasible candidate: {exc}", file=sys.stderr)
        for described, missed in exc.closest:
            print(f"  {described}: " + "; ".join(missed), file=sys.stderr)
        return EXIT_INFEASIBLE
    except InputError as exc:
        print(f"metainfer: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except MetainferError as exc:
        print(f"metainfer: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _quiet_onnxruntime() -> None:
    """ORT's default logger warns about unused initializers in every calibration session; users see noise."""
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


if __name__ == "__main__":
    sys.exit(main())
