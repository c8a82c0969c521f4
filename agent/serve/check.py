"""``metainfer check-provisional``: the init container of a provisional serving pod.

A class with no adapted variant of its own serves the most similar class's (core.control.provisional). Before
its pod serves that variant, this container builds it (or loads it from the variant store), checks it on this
node (core.engine.onnode_check) and leaves for the serving container what to serve: ``variant.onnx`` and
``recipe.json`` in ``--out``, either the checked variant or the FP32 model. What it found is written as JSON to
the container's termination message, where the operator reads it (the pod's ``initContainerStatuses``) and
says it in the class's status.

Only the base model must be available: without it nothing can serve, and the container fails as serving would.
Anything else that goes wrong with the variant (another runtime's bytes, an execution provider this node lacks,
unreadable data) means FP32.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from pathlib import Path

from pydantic import ValidationError

from metainfer.agent.fetch import FetchError, fetch
from metainfer.agent.inputs import synthetic_dataset
from metainfer.agent.serve.command import variant_sha256_from_args
from metainfer.agent.serve.model import ModelSourceArgs, fetch_base, variant_bytes
from metainfer.core.api.pod_contract import (
    ENV_NAMESPACE,
    FLAG_RECIPE_JSON,
    PROVISIONAL_RECIPE_FILE,
    PROVISIONAL_VARIANT_FILE,
)
from metainfer.core.engine.data import Dataset, load_npz
from metainfer.core.engine.errors import InputError, MetainferError
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.onnode_check import CHECK_SAMPLES, check_variant, fp32_session_recipes
from metainfer.core.engine.onnode_result import CheckBudget, OnNodeCheck, bounded
from metainfer.core.engine.recipe import Recipe, TransformSpec
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.transforms import build_variant

log = logging.getLogger("metainfer.check")

MESSAGE_LIMIT = 4096  # the kubelet keeps this much of a termination message
CHECK_SEED = 0  # the same random samples on every node: results of two pods compare
EXIT_INPUT = 2  # as metainfer serve: a permanent problem with the inputs


def check_provisional_command(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    recipe, budget = _recipe_and_budget(args)
    sha256 = variant_sha256_from_args(args)
    source = ModelSourceArgs(
        model_uri=args.model_uri,
        model_sha256=args.model_sha256,
        data_uri=args.data_uri,
        data_sha256=args.data_sha256,
        calibration_samples=args.calibration_samples,
        variant_sha256=sha256,
        variant_store=args.variant_store,
        namespace=os.environ.get(ENV_NAMESPACE) or "default",
    )
    with tempfile.TemporaryDirectory(prefix="metainfer-check-") as tmp:
        try:
            (served, served_recipe), result = check_and_choose(source, recipe, budget, Path(tmp))
        except FetchError as exc:  # no base model, nothing to serve: fail as serve would, retried if transient
            log.error("the base model cannot be fetched: %s", exc)
            return 1 if exc.transient else EXIT_INPUT
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / PROVISIONAL_VARIANT_FILE).write_bytes(served)
    (args.out / PROVISIONAL_RECIPE_FILE).write_text(served_recipe.model_dump_json())
    log.info("%s", result.describe())
    try:
        args.message_file.write_text(result.model_dump_json(exclude_none=True)[:MESSAGE_LIMIT])
    except OSError as exc:  # outside a pod there may be no termination log: the log line says it all
        log.warning("cannot write the result to %s: %s", args.message_file, exc)
    return 0


def check_and_choose(
    source: ModelSourceArgs, recipe: Recipe, budget: CheckBudget, workdir: Path
) -> tuple[tuple[bytes, Recipe], OnNodeCheck]:
    """((the bytes to serve, their recipe), what the check found). Raises only when the base model is unusable."""
    info, base, _ = fetch_base(source, workdir)
    data, data_problem = _samples(source, info, workdir)
    try:
        variant = variant_bytes(source, recipe, info, base, workdir)
    except (MetainferError, FetchError, OSError) as exc:
        result = OnNodeCheck(
            serves="fp32",
            variant_sha256=source.variant_sha256,
            budget=budget,
            reason=bounded(f"the variant cannot be had here: {exc}"),
        )
        return _fp32(base, recipe), result
    result = check_variant(base, variant, recipe, data, budget, variant_sha256=source.variant_sha256)
    if data_problem and result.serves == "variant":  # measured, but on random inputs: say so
        log.warning("quality was checked on random inputs: %s", data_problem)
    return ((variant, recipe) if result.serves == "variant" else _fp32(base, recipe)), result


def _samples(source: ModelSourceArgs, info: ModelInfo, workdir: Path) -> tuple[Dataset, str | None]:
    """The policy's NPZ when it has one and it loads, else seeded random inputs (and why)."""
    problem = None
    if source.data_uri is not None:
        try:
            path = fetch(
                source.data_uri, workdir / "data.npz", expected_sha256=source.data_sha256,
                namespace=source.namespace, configmaps=None, what="data",
            )  # fmt: skip
            return load_npz(path, info), None
        except (MetainferError, FetchError, OSError) as exc:
            problem = f"{source.data_uri}: {exc}"
    return synthetic_dataset(info, [], CHECK_SEED, CHECK_SAMPLES), problem


def _fp32(base: bytes, recipe: Recipe) -> tuple[bytes, Recipe]:
    """The base model untransformed (stamped with its provenance, as serve --variant requires), with the first
    session settings that load here: the variant's (threads, execution provider), else ONNX Runtime's defaults."""
    fp32 = build_variant(base, TransformSpec())
    candidates = fp32_session_recipes(recipe)
    for candidate in candidates[:-1]:
        try:
            create_session(fp32, candidate)
        except Exception as exc:  # ONNX Runtime raises several unrelated types
            log.warning("FP32 with the variant's session settings fails here (%s): ONNX Runtime's defaults", exc)
            continue
        return fp32, candidate
    return fp32, candidates[-1]


def _recipe_and_budget(args: argparse.Namespace) -> tuple[Recipe, CheckBudget]:
    try:
        recipe = Recipe.model_validate_json(args.recipe_json)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(FLAG_RECIPE_JSON, f"not a valid recipe: {first['msg']}") from exc
    try:
        budget = CheckBudget(
            max_quality_drop=args.max_quality_drop,
            latency_p95_ms=args.latency_p95_ms,
            quality_metric=args.quality_metric,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = "--" + str(first["loc"][0]).replace("_", "-")
        raise InputError(flag, str(first["msg"])) from exc
    return recipe, budget
