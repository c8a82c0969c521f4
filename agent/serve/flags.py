"""The flags of ``metainfer serve``, importing nothing heavy: ``metainfer --help`` builds every parser."""

from __future__ import annotations

import argparse
from pathlib import Path

from metainfer.agent.serve.unsent import DEFAULT_MAX_UNSENT_MIB
from metainfer.core.api.pod_contract import (
    ENV_POLICY,
    ENV_SHUTDOWN_DELAY_MAX,
    FLAG_BATCH_DEPENDENT,
    FLAG_CALIBRATION_SAMPLES,
    FLAG_DATA_SHA256,
    FLAG_DATA_URI,
    FLAG_DRAIN_TIMEOUT,
    FLAG_GRPC_PORT,
    FLAG_LATENCY_P95_MS,
    FLAG_MAX_QUALITY_DROP,
    FLAG_MAX_QUEUE_DELAY_MS,
    FLAG_MODEL_SHA256,
    FLAG_MODEL_URI,
    FLAG_OUT,
    FLAG_PORT,
    FLAG_QUALITY_METRIC,
    FLAG_RECIPE,
    FLAG_RECIPE_JSON,
    FLAG_SHUTDOWN_DELAY,
    FLAG_VARIANT,
    FLAG_VARIANT_SHA256,
    FLAG_VARIANT_STORE,
    GRPC_PORT,
    HTTP_PORT,
    TERMINATION_MESSAGE_PATH,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``metainfer serve`` (core/control/manifests.py build_deployment writes those of
    core.api.pod_contract)."""
    parser.add_argument(
        FLAG_MODEL_URI,
        required=True,
        help="base model: http(s)://, s3://, gs://, az://, hf://, file:///path or configmap://NAME/KEY",
    )
    parser.add_argument(FLAG_MODEL_SHA256, help="expected sha256 of the base model (verified before loading)")
    recipe = parser.add_mutually_exclusive_group(required=True)
    recipe.add_argument(FLAG_RECIPE_JSON, help="the recipe as JSON (derived fields are ignored)")
    recipe.add_argument(FLAG_RECIPE, type=Path, help="a recipe.json file (as `metainfer adapt` writes)")
    parser.add_argument(FLAG_DATA_URI, help="calibration NPZ; needed to rebuild an int8_static variant")
    parser.add_argument(FLAG_DATA_SHA256, help="expected sha256 of the calibration NPZ")
    parser.add_argument(
        FLAG_CALIBRATION_SAMPLES, type=int, default=64, help="samples the adaptation calibrated on (default 64)"
    )
    parser.add_argument(FLAG_VARIANT, type=Path, help="a prebuilt variant; its provenance must match the recipe")
    parser.add_argument(
        FLAG_VARIANT_SHA256,
        help="sha256 of the variant the adaptation validated (its run's status.bestVariantSha256): the variant"
        " loaded from --variant-store, or rebuilt, must have exactly these bytes",
    )
    parser.add_argument(
        FLAG_VARIANT_STORE, type=Path,
        help="a content-addressed variant store (DIR/sha256/HEX.onnx, as adaptation Jobs write it): load the"
        " --variant-sha256 variant from it instead of rebuilding; rebuild if it is missing or corrupt",
    )  # fmt: skip
    parser.add_argument("--model-name", help=f"name in /v2/models/NAME (default: ${ENV_POLICY}, else file stem)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default %(default)s)")
    parser.add_argument(FLAG_PORT, type=int, default=HTTP_PORT, help="port (default %(default)s)")
    parser.add_argument(
        FLAG_GRPC_PORT, type=int, default=GRPC_PORT,
        help="port of the KServe v2 gRPC API, opened once the model is loaded (default %(default)s; 0: no gRPC)",
    )  # fmt: skip
    parser.add_argument("--max-batch", type=int, help="largest batch accepted (default: max(recipe batch, 64))")
    parser.add_argument(
        FLAG_SHUTDOWN_DELAY, type=float, default=5.0,
        help="seconds between SIGTERM/SIGINT and the drain: new connections and requests are still accepted and"
        " answered (each response closes its connection), since endpoints take a moment to drop a terminating pod;"
        " while inference requests still come (the last endpoint serving: the only replica deleted, its replacement"
        " still starting), on until none has come for this long; a second SIGTERM/SIGINT ends the delay (default 5;"
        " 0: drain at once)",
    )  # fmt: skip
    parser.add_argument(
        "--shutdown-delay-max", type=float,
        help="seconds after SIGTERM/SIGINT by which the drain starts, however many requests still come (default:"
        f" ${ENV_SHUTDOWN_DELAY_MAX}, which the operator's pods set, else --shutdown-delay: no"
        " lengthening; keep it and --drain-timeout within the pod's termination grace period)",
    )  # fmt: skip
    parser.add_argument(
        FLAG_DRAIN_TIMEOUT, type=float, default=20.0,
        help="seconds in-flight requests get once the shutdown delay is over (default 20)",
    )  # fmt: skip
    parser.add_argument(
        "--workers", type=int,
        help="ONNX Runtime runs at once (default: the usable cores divided by the recipe's intra-op threads, at least"
        " 1, so concurrent runs never oversubscribe the cores the adaptation measured on)",
    )  # fmt: skip
    parser.add_argument(
        "--max-queue", type=int, default=64,
        help="inference requests admitted at once (queued or running); more get 503 + Retry-After (default 64)",
    )  # fmt: skip
    parser.add_argument(
        "--request-timeout", type=float, default=30.0,
        help="each request's deadline, counted from its arrival: one still queued then is answered 503 without"
        " running, one still running is stopped (ONNX Runtime's terminate flag) and answered 503 (default 30)",
    )  # fmt: skip
    parser.add_argument(
        "--body-timeout", type=float, default=30.0, help="seconds for a request body to arrive, else 408 (default 30)"
    )
    parser.add_argument(
        "--write-timeout", type=float, default=30.0,
        help="seconds for an answer to be taken by the client: a request keeps its --max-queue slot until then, and"
        " a client that does not read its answer in time is cut (default 30)",
    )  # fmt: skip
    parser.add_argument(
        "--max-unsent-mib", type=float, default=float(DEFAULT_MAX_UNSENT_MIB),
        help="MiB of answers computed but not yet taken by their clients, in total (a connection gets a quarter);"
        f" an answer that does not fit is refused 503 with Retry-After (default {DEFAULT_MAX_UNSENT_MIB})",
    )  # fmt: skip
    parser.add_argument(
        "--kv-cache-mib", type=float, default=256.0,
        help="decoders: MiB of KV cache the running generations may reserve together (each reserves its prompt"
        " plus max_tokens); what does not fit waits in --max-queue, then gets 429 (default 256)",
    )  # fmt: skip
    parser.add_argument(
        "--max-context", type=int,
        help="decoders: the longest prompt plus max_tokens (default: the model's max_position_embeddings, else 2048)",
    )  # fmt: skip
    parser.add_argument(
        "--max-generating", type=int, default=16,
        help="decoders: generations decoded together in one step (iteration-level batching) (default 16)",
    )  # fmt: skip
    parser.add_argument(
        "--idle-timeout", type=float, default=15.0,
        help="seconds a connection may stay without a complete request (idle keep-alive, slow headers) (default 15)",
    )  # fmt: skip
    parser.add_argument(
        "--grpc-max-connection-age", type=float, default=300.0,
        help="seconds after which a gRPC connection is asked to reconnect (GOAWAY; clients do so by themselves)"
        " and, once its calls have had --request-timeout plus --write-timeout to finish, closed: the bound on how"
        " long a client that does not read its answers holds them (default 300; 0: no limit)",
    )  # fmt: skip
    parser.add_argument(
        "--batch-size", type=int,
        help="rows one ONNX Runtime run combines from concurrent requests (default: the recipe's batch, the one the"
        " adaptation measured)",
    )  # fmt: skip
    parser.add_argument(
        FLAG_MAX_QUEUE_DELAY_MS, type=float, default=1.0,
        help="how long a lone request waits for others to share its run (dynamic batching) (default 1)",
    )  # fmt: skip
    parser.add_argument(
        FLAG_BATCH_DEPENDENT, choices=("combine", "isolate"), default="combine",
        help="for a variant whose outputs depend on the other requests of its run (dynamic int8: one activation"
        " scale per run): 'combine' batches it like any other, its outputs varying within what validation measured"
        " and held to the quality budget; 'isolate' runs each request alone, so the same request always gets the"
        " same outputs, at the cost of throughput under concurrency (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--max-dynamic-dim",
        type=int,
        default=4096,
        help="largest size of a dynamic input axis other than the batch; with --max-batch it bounds the body size"
        " (default 4096)",
    )


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``metainfer check-provisional`` (build_deployment writes them for a provisional class)."""
    parser.add_argument(FLAG_MODEL_URI, required=True, help="base model: http(s)://, file:///path")
    parser.add_argument(FLAG_MODEL_SHA256, help="expected sha256 of the base model")
    parser.add_argument(FLAG_RECIPE_JSON, required=True, help="the recipe of the variant to check, as JSON")
    parser.add_argument(FLAG_VARIANT_SHA256, help="the bytes the variant's own run validated (64 hex digits)")
    parser.add_argument(FLAG_VARIANT_STORE, type=Path, help="a content-addressed variant store to load it from")
    parser.add_argument(FLAG_DATA_URI, help="NPZ samples: int8_static's calibration, and the quality check's")
    parser.add_argument(FLAG_DATA_SHA256, help="expected sha256 of the NPZ")
    parser.add_argument(FLAG_CALIBRATION_SAMPLES, type=int, default=64, help="samples int8_static calibrated on")
    parser.add_argument(FLAG_MAX_QUALITY_DROP, type=float, required=True, help="the policy's quality budget (0-1)")
    parser.add_argument(FLAG_LATENCY_P95_MS, type=float, required=True, help="the policy's p95 SLO per batch, ms")
    parser.add_argument(FLAG_QUALITY_METRIC, default="auto", help="the metric the quality budget is written in")
    parser.add_argument(FLAG_OUT, type=Path, required=True, help="dir for the variant.onnx, recipe.json to serve")
    parser.add_argument(
        "--message-file", type=Path, default=Path(TERMINATION_MESSAGE_PATH),
        help="where the result goes as JSON (default %(default)s: the container's termination message)",
    )  # fmt: skip
