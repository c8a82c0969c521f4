"""The ``metainfer`` command: one entry point for every role.

Subcommands import their machinery lazily so ``metainfer --help`` stays fast
and a node running only the agent never imports kopf. Flags and input paths
are checked before anything heavy (ONNX, ONNX Runtime, numpy) is imported, so
a mistyped path fails at once.

Exit codes: 0 success, 2 bad input (one line naming the problem), 3 no
feasible candidate (the closest candidates and what each missed).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from metainfer.core.api.pod_contract import (
    AGENT_COMMAND,
    AGENT_RUN_COMMAND,
    CHECK_PROVISIONAL_COMMAND,
    PROGRAM,
    SERVE_COMMAND,
)
from metainfer.core.engine.algorithms import ALGORITHM_NAMES, DEFAULT_ALGORITHM, MAX_TRIAL_BUDGET, Algorithm
from metainfer.core.engine.errors import DataError, InputError, MetainferError, ModelError, NoFeasibleCandidate
from metainfer.core.engine.scoring import (
    DEFAULT_LATENCY_WEIGHT,
    DEFAULT_MEMORY_WEIGHT,
    DEFAULT_QUALITY_WEIGHT,
    DEFAULT_THROUGHPUT_WEIGHT,
)

if TYPE_CHECKING:
    from metainfer.core.api.policy import InputSpec

EXIT_INPUT, EXIT_INFEASIBLE = 2, 3
MAX_SEED = 2**31 - 1  # as the policy's spec.search.seed

ALGORITHM_HELP: dict[Algorithm, str] = {
    "hybrid": "a start from the knobs' known-good defaults (or --history's related winners), evolutionary"
    " moves, then Bayesian refinement; a cheap surrogate picks which proposals reach the hardware (default)",
    "bayes": "Bayesian optimisation (scikit-optimize) after a space-filling start",
    "evolution": "steady-state evolutionary search after a space-filling start",
    "random": "uniform random candidates: the baseline the others must beat",
    "grid": "every combination in a fixed order: exhaustive when --budget-trials covers the space,"
    " otherwise only the first choices of the leading knobs",
}
WEIGHT_FLAGS = ("--latency-weight", "--throughput-weight", "--memory-weight", "--quality-weight")

# argparse names the converter of a flag whose value does not parse ("invalid int value"); a user
# typed a flag, not a Python type, so these read as what was expected.
_BUILTIN_TYPES = {"int": "a whole number", "float": "a number"}


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line naming the flag, exit 2 (the same contract as bad input files)."""

    def error(self, message: str) -> NoReturn:
        message = re.sub(
            r"invalid (\w+) value: ('.*')",
            lambda m: f"expected {_BUILTIN_TYPES.get(m[1], 'a valid value')}, got {m[2]}",
            message,
        )
        self.exit(EXIT_INPUT, f"metainfer: error: {message} (see '{self.prog} --help')\n")


class _Version(argparse.Action):
    """``--version``, read from the installed package's metadata only when asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the installed version and exit", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> NoReturn:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = f"metainfer {version('metainfer')}"
        except PackageNotFoundError:
            text = "metainfer: not installed (no package metadata), so no version"
        print(text)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROGRAM, description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("profile", help="measure this machine's hardware profile")
    p.add_argument("--out", type=Path, help="also write the profile JSON here")
    p.add_argument("--refresh", action="store_true", help="ignore the cached profile and measure again")

    a = sub.add_parser(
        "adapt",
        help="adapt an ONNX model to this machine",
        description="Search quantization, graph and session settings for MODEL on this machine; write the best"
        " variant, its recipe, a report and a plot to --out.",
        epilog="search algorithms (--algorithm):\n"
        + "\n".join(f"  {name:<10} {ALGORITHM_HELP[name]}" for name in ALGORITHM_NAMES)
        + "\n\nscore of a feasible candidate: the weights times its latency speedup, throughput, memory"
        " saving and\nquality, each relative to FP32; latencies within the measured timing noise are ties,"
        " decided by\nmemory and quality.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a.add_argument(
        "model",
        metavar="MODEL",
        type=_file_or_uri,
        help="the FP32 ONNX model: a file, or an s3://, gs://, az://, hf:// or https:// URI (fetched with"
        " --credentials, else the store's usual environment variables)",
    )
    a.add_argument(
        "--data",
        type=_file_or_uri,
        help="NPZ: arrays named after the inputs [+ labels]; a file or a URI like MODEL. Without it: seeded random"
        " inputs shaped like the model's, as a policy without spec.model.data gets (quality against FP32 on them,"
        " not task accuracy)",
    )
    a.add_argument(
        "--input-shape",
        type=_input_shape,
        action="append",
        default=[],
        dest="input_shapes",
        metavar="NAME=D0,D1,...",
        help="without --data: the shape of input NAME's random samples where the model leaves axes open (-1 for"
        " the batch axis), e.g. pixel_values=-1,3,224,224; repeatable (policy: spec.model.inputs)",
    )
    a.add_argument("--model-sha256", type=_sha256, help="pin a fetched MODEL: other bytes fail the fetch")
    a.add_argument("--data-sha256", type=_sha256, help="pin fetched --data the same way")
    a.add_argument(
        "--credentials",
        type=Path,
        metavar="DIR",
        help="the store's keys, one file per key as a Kubernetes Secret is mounted (docs/model-stores.md);"
        " default: the same names from the environment (AWS_ACCESS_KEY_ID, HF_TOKEN, ...)",
    )
    a.add_argument("--batch", type=_positive_int, default=1, help="production batch size (default 1)")
    a.add_argument("--search-batch", action="store_true", help="also search the batch size")
    a.add_argument("--slo-p95-ms", type=_positive_float, help="p95 latency SLO per batch, ms")
    a.add_argument("--slo-p99-ms", type=_positive_float, help="p99 latency bound per batch, ms (optional)")
    a.add_argument(
        "--max-accuracy-drop",
        type=_fraction,
        default=0.01,
        help="largest quality drop vs FP32 (top-1 points as a fraction, or 1-cosine); default 0.01",
    )
    a.add_argument(
        "--quality-metric",
        type=_quality_metric,
        default="auto",
        help="the metric --max-accuracy-drop is written in: auto (default), top1_accuracy, cosine_similarity,"
        " argmax_agreement (share of samples whose every step keeps FP32's argmax), relative_l2_similarity"
        " (1 - the relative L2 error of the outputs), or plugin:<entry point>",
    )
    a.add_argument("--max-memory-mib", type=_positive_float, help="peak memory limit of the process, MiB")
    a.add_argument(
        "--serving-memory-limit-mib",
        type=_positive_float,
        help="memory limit of the container that will serve the variant, MiB: less serve's own floor (measured in"
        " this environment) and its 128 MiB of buffers, it bounds what a variant itself may take",
    )
    a.add_argument(
        "--budget-trials",
        type=_budget,
        default=24,
        help=f"candidates to measure, 1 to {MAX_TRIAL_BUDGET} (default 24)",
    )
    a.add_argument("--time-budget-s", type=_time_budget, help="stop searching after this many seconds (>= 1)")
    a.add_argument(
        "--algorithm",
        choices=ALGORITHM_NAMES,
        default=DEFAULT_ALGORITHM,
        metavar="NAME",
        help=f"search algorithm: {', '.join(ALGORITHM_NAMES)} (default {DEFAULT_ALGORITHM}; each is described below)",
    )
    a.add_argument("--seed", type=_seed, default=0, help=f"seed of every random choice, 0 to {MAX_SEED} (default 0)")
    for flag, default, what in (
        ("--latency-weight", DEFAULT_LATENCY_WEIGHT, "speedup: FP32's median latency over the candidate's"),
        ("--throughput-weight", DEFAULT_THROUGHPUT_WEIGHT, "items/s over FP32's"),
        ("--memory-weight", DEFAULT_MEMORY_WEIGHT, "FP32's peak memory over the candidate's"),
        ("--quality-weight", DEFAULT_QUALITY_WEIGHT, "quality metric over FP32's"),
    ):
        a.add_argument(flag, type=_weight, default=default, metavar="W", help=f"weight of {what} (default {default:g})")
    a.add_argument(
        "--history",
        type=Path,
        nargs="+",
        metavar="DIR_OR_REPORT",
        help="earlier runs' report.json files, or directories searched recursively for them: the hybrid search"
        " starts from what related runs (this model on similar hardware, a similar model here) measured",
    )
    d = a.add_argument_group(
        "decoders",
        "a model with past key values is adapted as a decoder: prefill of a prompt, then token-by-token"
        " decode with its KV cache; these replace --batch, --slo-p95-ms and --max-accuracy-drop for it",
    )
    d.add_argument("--prompt-tokens", type=_positive_int, default=128, help="prompt of the workload (default 128)")
    d.add_argument("--decode-tokens", type=_positive_int, default=64, help="tokens decoded per run (default 64)")
    d.add_argument("--concurrency", type=_positive_int, default=4,
                   help="streams decoding together for the aggregate tokens/s (default 4)")  # fmt: skip
    d.add_argument("--max-context", type=_positive_int,
                   help="context the KV cache is sized for (default: the model's, else 2048)")  # fmt: skip
    d.add_argument("--slo-ttft-p95-ms", type=_positive_float, help="time to first token p95, ms")
    d.add_argument("--slo-tpot-p95-ms", type=_positive_float, help="time per output token p95, ms")
    d.add_argument("--min-tokens-per-s", type=_positive_float, help="decode tokens/s of one stream, at least")
    d.add_argument("--max-perplexity-rise", type=_fraction, default=0.03,
                   help="perplexity on the reference text over FP32's, as a fraction (default 0.03)")  # fmt: skip
    a.add_argument("--out", type=Path, required=True, help="output directory")

    lp = sub.add_parser(
        "llm-pack",
        help="pack an exported decoder's directory (model.onnx, tokenizer.json, ...) into one servable ONNX file",
    )
    lp.add_argument("source", metavar="EXPORT", type=Path, help="the export directory, or its model.onnx")
    lp.add_argument("-o", "--out", type=Path, required=True, help="the packed model file to write")

    e = sub.add_parser("examples", help="build the bundled example models")
    e.add_argument("action", choices=["build"], metavar="ACTION")
    e.add_argument("out", metavar="DIR", type=Path)
    e.add_argument("--only", nargs="*", help="names to build (default: digits and the transformer)")

    rt = sub.add_parser(
        "runtime",
        help="print this image's ONNX Runtime build as the run key records it (the chart's agent.runtime)",
    )
    rt.add_argument(
        "--providers",
        action="store_true",
        help="print JSON instead: the runtime, and each execution provider this build offers with whether a "
        "session on it runs here (null) or why not",
    )

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

    s = sub.add_parser(
        SERVE_COMMAND, help="serve an adapted variant over the KServe v2 / Open Inference Protocol REST API"
    )
    from metainfer.agent.serve.flags import add_arguments as add_serve_arguments

    add_serve_arguments(s)

    c = sub.add_parser(
        CHECK_PROVISIONAL_COMMAND,
        help="check another class's variant on this node before serving it; leave it, or FP32, for serve",
    )
    from metainfer.agent.serve.flags import add_check_arguments

    add_check_arguments(c)

    k = sub.add_parser(
        "check-install",
        help="is the operator rolled out and is a policy admitted? (what `helm test` runs; exit 1 on a failed check)",
    )
    k.add_argument("--deployment", required=True, metavar="NAMESPACE/NAME", help="the operator's Deployment")
    k.add_argument(
        "--policy-namespace",
        action="append",
        default=[],
        dest="policy_namespaces",
        metavar="NAMESPACE",
        help="a workload namespace where a dry-run AdaptationPolicy must be admitted (repeatable)",
    )
    k.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, else $KUBECONFIG)")

    g = sub.add_parser(AGENT_COMMAND, help="node-side roles run by the operator's Jobs")
    gsub = g.add_subparsers(dest="agent_command", required=True, metavar="ROLE", parser_class=_Parser)
    gr = gsub.add_parser(AGENT_RUN_COMMAND, help="execute one AdaptationRun and write its status (the adaptation Job)")
    gr.add_argument("run", metavar="NAMESPACE/RUN", help="the AdaptationRun to execute")
    gr.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, else $KUBECONFIG)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "adapt":
            check_adapt_args(args)
        if args.command not in (
            "operator",
            "runtime",
            "check-install",
        ):  # they run no model; ORT and numpy would add ~30 MB to its RSS
            _quiet_onnxruntime()
        if args.command == "profile":
            from metainfer.agent.commands import profile_command

            return profile_command(args.out, args.refresh)
        if args.command == "adapt":
            from metainfer.agent.commands import adapt_command

            return adapt_command(args)
        if args.command == "llm-pack":
            from metainfer.agent.commands import out
            from metainfer.agent.llm_pack import pack

            out.print(pack(args.source, args.out), highlight=False)
            return 0
        if args.command == "examples":
            from metainfer.agent.commands import examples_command

            return examples_command(args.out, args.only)
        if args.command == "runtime":
            from metainfer.agent.commands import runtime_command

            return runtime_command(providers=args.providers)
        if args.command == "operator":
            from metainfer.operator.main import run as run_operator

            return run_operator(args.namespaces, args.liveness or None, args.standalone, args.verbose)
        if args.command == SERVE_COMMAND:
            from metainfer.agent.serve.command import serve_command

            return serve_command(args)
        if args.command == CHECK_PROVISIONAL_COMMAND:
            from metainfer.agent.serve.check import check_provisional_command

            return check_provisional_command(args)
        if args.command == "check-install":
            from metainfer.agent.install_check import check_install_command

            return check_install_command(args.deployment, args.policy_namespaces, args.kubeconfig)
        if args.command == AGENT_COMMAND:
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


def check_adapt_args(args: argparse.Namespace) -> None:
    """What ``adapt`` can tell about its flags and paths without loading anything: a typo fails in milliseconds,
    not after ONNX Runtime has loaded (or, for --out, after the whole search)."""
    weights = [getattr(args, flag[2:].replace("-", "_")) for flag in WEIGHT_FLAGS]
    if not any(w > 0 for w in weights):
        raise InputError(", ".join(WEIGHT_FLAGS), "at least one objective weight must be > 0")
    if isinstance(args.model, Path):
        _check_input_file(args.model, ModelError)
    if isinstance(args.data, Path):
        _check_input_file(args.data, DataError)
    if args.data is not None and args.input_shapes:
        raise InputError("--input-shape", "shapes random inputs, so it goes without --data (the data has shapes)")
    if args.data is None and args.data_sha256 is not None:
        raise InputError("--data-sha256", "pins fetched --data, and no --data was given")
    if args.credentials is not None and not args.credentials.is_dir():
        raise InputError(f"--credentials {args.credentials}", "not a directory (one file per key)")
    for path in getattr(args, "history", None) or []:
        if not path.exists():
            raise InputError(f"--history {path}", "no such file or directory")
        if path.is_dir() and not any(path.rglob("report.json")):
            raise InputError(f"--history {path}", "no report.json under this directory")
    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}", "exists and is not a directory")
    try:  # the one reliable test of "can the results be written there", before the search rather than after
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}", f"cannot create the directory: {exc.strerror or exc}") from None


def _file_or_uri(value: str) -> Path | str:
    """A local path, or a URI the agent's fetch reads (agent/fetch.py); a URI of another scheme is refused here."""
    if "://" not in value:
        return Path(value)
    from metainfer.core.api.policy import MODEL_URI_PATTERN

    if not re.match(MODEL_URI_PATTERN, value) or value.startswith(("configmap://", "file://")):
        raise argparse.ArgumentTypeError(
            f"{value[:200]!r}: expected a file or an s3://, gs://, az://, hf:// or http(s):// URI"
        )
    return value


def _input_shape(value: str) -> InputSpec:
    """NAME=D0,D1,... as the policy's spec.model.inputs entry it stands for."""
    from metainfer.core.api.policy import InputSpec

    name, _, dims = value.partition("=")
    try:
        return InputSpec(name=name, shape=[int(d) for d in dims.split(",")])
    except ValueError as exc:  # int() or the InputSpec's own checks (an empty name, a dim below -1)
        raise argparse.ArgumentTypeError(
            f"{value[:200]!r}: expected NAME=D0,D1,... with whole dims (-1 for the batch axis)"
        ) from exc


def _sha256(value: str) -> str:
    if not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise argparse.ArgumentTypeError(f"{value[:80]!r} is not a hex sha256 (64 digits)")
    return value.lower()


def _check_input_file(path: Path, error: type[InputError]) -> None:
    # The messages modelinfo.load_model and data.load_npz give for the same problems.
    if not path.exists():
        raise error(str(path), "no such file")
    if not path.is_file():
        raise error(str(path), "not a regular file")
    if path.stat().st_size == 0:
        raise error(str(path), "file is empty")


def _quiet_onnxruntime() -> None:
    """ORT's default logger warns about unused initializers in every calibration session; users see noise."""
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)


# Converters for flag values; their errors are read as "argument --flag: <message>".


def _whole(text: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    if high is not None and value > high:
        raise argparse.ArgumentTypeError(f"must be <= {high}, got {value}")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    return _whole(text, 1)


def _budget(text: str) -> int:
    return _whole(text, 1, MAX_TRIAL_BUDGET)


def _seed(text: str) -> int:
    return _whole(text, 0, MAX_SEED)


def _positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _time_budget(text: str) -> float:
    value = _number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must allow at least 1 s of search, got {text}")
    return value


def _weight(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = _number(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _quality_metric(text: str) -> str:
    from metainfer.core.engine.quality_choice import CHOICE_PATTERN

    if not re.match(CHOICE_PATTERN, text):
        raise argparse.ArgumentTypeError(
            f"expected auto, top1_accuracy, cosine_similarity, argmax_agreement or plugin:<name>, got {text[:80]!r}"
        )
    return text


if __name__ == "__main__":
    sys.exit(main())
