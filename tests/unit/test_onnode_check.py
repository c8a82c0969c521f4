"""A provisional pod checks another class's variant on its node before serving it, and serves FP32 if it fails
(issue 31, item 2): the check measures, the result says why, and serve loads whichever it left."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest

from metainfer.agent.serve.check import check_and_choose, check_provisional_command
from metainfer.agent.serve.flags import add_check_arguments
from metainfer.agent.serve.model import ModelSourceArgs, load
from metainfer.core.engine.data import Dataset
from metainfer.core.engine.errors import InputError
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.onnode_check import check_variant
from metainfer.core.engine.onnode_result import CheckBudget, OnNodeCheck
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, TransformSpec
from metainfer.core.engine.transforms.build import build_variant

DYNAMIC = Recipe(transform=TransformSpec(quantization=QuantizationSpec(mode="int8_dynamic")), batch=4)
LOOSE = CheckBudget(max_quality_drop=0.05, latency_p95_ms=1000.0)


def test_a_variant_within_the_slo_on_this_node_passes_with_what_was_measured(
    digits: tuple[bytes, ModelInfo, Dataset],
) -> None:
    base, _, data = digits
    result = check_variant(base, build_variant(base, DYNAMIC.transform), DYNAMIC, data, LOOSE)
    assert result.serves == "variant" and result.reason == ""
    assert result.quality_metric == "top1_accuracy" and result.samples == 64
    assert result.quality_drop is not None and result.quality_drop <= 0.05
    assert result.latency_p95_ms is not None and 0 < result.latency_p95_ms < 1000
    assert result.describe().startswith("on-node check passed: quality drop")


def test_a_variant_over_the_slo_or_that_does_not_run_here_means_fp32(digits: tuple[bytes, ModelInfo, Dataset]) -> None:
    base, _, data = digits
    variant = build_variant(base, DYNAMIC.transform)
    slow = check_variant(base, variant, DYNAMIC, data, CheckBudget(max_quality_drop=0.05, latency_p95_ms=1e-6))
    assert slow.serves == "fp32" and "over the SLO" in slow.reason and slow.latency_p95_ms is not None
    broken = check_variant(base, b"not a model", DYNAMIC, data, LOOSE)
    assert broken.serves == "fp32" and broken.reason.startswith("it does not run on this node")
    assert len(broken.reason) <= 400
    assert "serving FP32" in broken.describe()


def _source(path: Path, **extra: object) -> ModelSourceArgs:
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return ModelSourceArgs(model_uri=path.as_uri(), model_sha256=sha, **extra)  # type: ignore[arg-type]


def test_bytes_other_than_the_validated_ones_are_refused_and_fp32_is_left_for_serve(
    examples: dict[str, Path], tmp_path: Path
) -> None:
    path = examples["digits"]
    source = _source(path, variant_sha256="0" * 64)  # what another runtime's rebuild would not reproduce
    (served, recipe), result = check_and_choose(source, DYNAMIC, LOOSE, tmp_path)
    assert result.serves == "fp32" and "adaptation validated" in result.reason
    assert recipe.transform.quantization.mode == "fp32" and recipe.batch == DYNAMIC.batch
    variant_path = tmp_path / "variant.onnx"
    variant_path.write_bytes(served)
    loaded = load(_source(path, variant_path=variant_path), recipe, None)  # what serve --variant does with it
    assert loaded.base_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_command_leaves_the_variant_and_writes_its_result_where_the_operator_reads_it(
    examples: dict[str, Path], tmp_path: Path
) -> None:
    path = examples["digits"]
    parser = argparse.ArgumentParser()
    add_check_arguments(parser)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    common = ["--model-uri", path.as_uri(), "--model-sha256", sha, "--recipe-json", DYNAMIC.model_dump_json()]
    common += ["--data-uri", (path.parent / "data.npz").as_uri(), "--out", str(tmp_path / "out")]
    message = tmp_path / "termination-log"
    args = parser.parse_args([*common, "--max-quality-drop", "0.05", "--latency-p95-ms", "1000"])
    args.message_file = message
    assert check_provisional_command(args) == 0
    result = OnNodeCheck.model_validate_json(message.read_text())
    assert result.serves == "variant" and result.quality_metric == "top1_accuracy"
    assert Recipe.model_validate_json((tmp_path / "out" / "recipe.json").read_text()) == DYNAMIC
    assert len(message.read_bytes()) <= 4096 and json.loads(message.read_text())["budget"]["latency_p95_ms"] == 1000

    with pytest.raises(InputError, match="--latency-p95-ms"):
        check_provisional_command(parser.parse_args([*common, "--max-quality-drop", "0.05", "--latency-p95-ms", "0"]))
    gone = parser.parse_args([*common, "--max-quality-drop", "0.05", "--latency-p95-ms", "9"])
    gone.model_uri = (tmp_path / "missing.onnx").as_uri()
    gone.message_file = message
    assert check_provisional_command(gone) == 2, "no base model: nothing to serve, the pod fails as serve would"
