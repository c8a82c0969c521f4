"""``metainfer serve`` arguments -> a ServeConfig, and the process's exit code.

Kept apart from ``agent/cli.py`` so the CLI module only declares flags, and from
``app`` so argument mistakes are reported before anything listens on a port.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pydantic import ValidationError

from metainfer.agent.serve.app import serve
from metainfer.agent.serve.dataplane import FrontEndFactory, ServeConfig
from metainfer.agent.serve.model import ModelSourceArgs
from metainfer.core.api.pod_contract import (
    ENV_NAMESPACE,
    ENV_POLICY,
    ENV_SHUTDOWN_DELAY_MAX,
    FLAG_GRPC_PORT,
    FLAG_MAX_QUEUE_DELAY_MS,
    FLAG_PORT,
    FLAG_RECIPE,
    FLAG_RECIPE_JSON,
    FLAG_SHUTDOWN_DELAY,
    FLAG_VARIANT_SHA256,
    FLAG_VARIANT_STORE,
)
from metainfer.core.engine.errors import InputError
from metainfer.core.engine.profile.fingerprint import usable_cores
from metainfer.core.engine.recipe import Recipe

log = logging.getLogger("metainfer.serve")


def serve_command(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = config_from_args(args)
    return serve(config, _grpc_front_end() if config.grpc_port else None)


def _grpc_front_end() -> FrontEndFactory:
    """The gRPC front end's factory, imported only when a gRPC port is asked for (grpcio is not loaded otherwise)."""
    from metainfer.agent.serve.grpc_server import GrpcFrontEnd

    return GrpcFrontEnd


def variant_sha256_from_args(args: argparse.Namespace) -> str | None:
    """--variant-sha256, checked: 64 lower-case hex digits, or absent."""
    sha256: str | None = args.variant_sha256
    if sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise InputError(FLAG_VARIANT_SHA256, f"must be 64 lower-case hex digits, got {sha256[:80]!r}")
    return sha256


def grpc_port_from_args(args: argparse.Namespace) -> int:
    """--grpc-port, checked: a port number, or 0 for no gRPC API, and never the REST port."""
    port = args.grpc_port
    if not 0 <= port <= 65535:
        raise InputError(FLAG_GRPC_PORT, f"must be a port number (1-65535), or 0 for no gRPC API; got {port}")
    if port and port == args.port:
        raise InputError(FLAG_GRPC_PORT, f"is also {FLAG_PORT} ({port}): REST and gRPC need a port each")
    return int(port)


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """Check the flags and build the config; raises InputError naming the flag."""
    recipe = _recipe(args)
    for flag in (
        "max_batch",
        "workers",
        "calibration_samples",
        "max_queue",
        "max_dynamic_dim",
        "batch_size",
        "max_context",
        "max_generating",
    ):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise InputError(f"--{flag.replace('_', '-')}", f"must be >= 1, got {value}")
    for flag in ("request_timeout", "body_timeout", "write_timeout", "idle_timeout", "drain_timeout"):
        value = getattr(args, flag)
        if not value > 0:
            raise InputError(f"--{flag.replace('_', '-')}", f"must be > 0 seconds, got {value}")
    if not args.kv_cache_mib > 0:
        raise InputError("--kv-cache-mib", f"must be > 0 MiB, got {args.kv_cache_mib}")
    if not args.max_unsent_mib > 0:
        raise InputError("--max-unsent-mib", f"must be > 0 MiB, got {args.max_unsent_mib}")
    sha256 = variant_sha256_from_args(args)
    if args.variant_store is not None and sha256 is None:
        raise InputError(
            FLAG_VARIANT_STORE, f"needs {FLAG_VARIANT_SHA256}: the store is addressed by the variant's sha256"
        )
    if args.variant_store is not None and not args.variant_store.is_dir():
        # Not fatal: a store that is not mounted yet (or at all) means rebuilding, which serve can always do.
        log.warning("--variant-store %s is not a directory: the variant will be rebuilt", args.variant_store)
    source = ModelSourceArgs(
        model_uri=args.model_uri,
        model_sha256=args.model_sha256,
        data_uri=args.data_uri,
        data_sha256=args.data_sha256,
        calibration_samples=args.calibration_samples,
        variant_path=args.variant,
        variant_sha256=sha256,
        variant_store=args.variant_store,
        namespace=os.environ.get(ENV_NAMESPACE) or "default",
    )
    return ServeConfig(
        source=source,
        recipe=recipe,
        model_name=args.model_name or default_model_name(args.model_uri),
        host=args.host,
        port=args.port,
        max_batch=args.max_batch,
        drain_timeout_s=args.drain_timeout,
        shutdown_delay_s=_non_negative(args.shutdown_delay, FLAG_SHUTDOWN_DELAY),
        shutdown_delay_max_s=_shutdown_delay_max(args.shutdown_delay_max),
        workers=args.workers or default_workers(recipe, usable_cores()),
        max_queue=args.max_queue,
        grpc_port=grpc_port_from_args(args),
        request_timeout_s=args.request_timeout,
        body_timeout_s=args.body_timeout,
        idle_timeout_s=args.idle_timeout,
        grpc_max_connection_age_s=_non_negative(args.grpc_max_connection_age, "--grpc-max-connection-age"),
        write_timeout_s=args.write_timeout,
        max_unsent_bytes=int(args.max_unsent_mib * (1 << 20)),
        max_dynamic_dim=args.max_dynamic_dim,
        batch_size=args.batch_size,
        max_queue_delay_s=_non_negative(args.max_queue_delay_ms, FLAG_MAX_QUEUE_DELAY_MS) / 1000,
        isolate_batch_dependent=args.batch_dependent == "isolate",
        kv_cache_bytes=int(args.kv_cache_mib * (1 << 20)),
        max_context=args.max_context,
        max_generating=args.max_generating,
    )


def default_workers(recipe: Recipe, cores: int) -> int:
    """Concurrent runs that fit the cores: each run takes the recipe's intra-op threads (0: ONNX Runtime takes
    every core). Two 2-thread runs on 2 cores made dynamic batching slower than one run of the combined batch."""
    threads = recipe.session.intra_op_num_threads or cores
    return max(1, cores // threads)


def _shutdown_delay_max(flag: float | None) -> float:
    """--shutdown-delay-max, else $METAINFER_SHUTDOWN_DELAY_MAX_SECONDS (the operator passes it so: an older serve
    image ignores an unknown variable, not an unknown flag), else 0: the shutdown delay is never lengthened."""
    if flag is not None:
        return _non_negative(flag, "--shutdown-delay-max")
    text = os.environ.get(ENV_SHUTDOWN_DELAY_MAX, "").strip()
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise InputError(ENV_SHUTDOWN_DELAY_MAX, f"must be a number of seconds >= 0, got {text[:40]!r}") from None
    return _non_negative(value, ENV_SHUTDOWN_DELAY_MAX)


def _non_negative(value: float, flag: str) -> float:
    if not value >= 0:
        raise InputError(flag, f"must be >= 0, got {value}")
    return value


def default_model_name(model_uri: str) -> str:
    """The policy's name in a cluster; locally the model file's stem (``model.onnx`` -> ``model``)."""
    policy = os.environ.get(ENV_POLICY)
    if policy:
        return policy
    parts = urlsplit(model_uri)
    tail = unquote(parts.path).rstrip("/").rsplit("/", 1)[-1] or parts.netloc
    return Path(tail).stem or "model"


def _recipe(args: argparse.Namespace) -> Recipe:
    if args.recipe is not None:
        try:
            text = args.recipe.read_text()
        except OSError as exc:
            raise InputError(FLAG_RECIPE, f"{args.recipe}: {exc.strerror or exc}") from exc
        flag = FLAG_RECIPE
    else:
        text, flag = args.recipe_json, FLAG_RECIPE_JSON
    try:
        return Recipe.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "recipe"
        raise InputError(flag, f"not a valid recipe: {where}: {first['msg']}") from exc
