"""Quality that means what the task means (issue 30 item 6): per-step argmax agreement for sequence classifiers,
chosen from the outputs or by the policy, and a platform's own metric by entry point."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from metainfer.core.engine import quality_metrics
from metainfer.core.engine.data import Dataset
from metainfer.core.engine.errors import DataError
from metainfer.core.engine.modelinfo import inspect_model
from metainfer.core.engine.pipeline import Adaptation, AdaptSettings
from metainfer.core.engine.profile import HardwareProfile
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.reference import Reference, make_reference, quality_of
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.scoring import Constraints

RNG = np.random.default_rng(0)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_auto_finds_a_per_step_distribution_and_nothing_else() -> None:
    logits = RNG.standard_normal((4, 25, 37)).astype(np.float32)
    assert quality_metrics.is_per_step_distribution(_softmax(logits))
    assert quality_metrics.is_per_step_distribution(np.log(_softmax(logits)))
    assert not quality_metrics.is_per_step_distribution(logits), "hidden states or unnormalised logits"
    boxes = np.abs(RNG.standard_normal((1, 8400, 85))).astype(np.float32) * 100  # a detector's raw head
    assert not quality_metrics.is_per_step_distribution(boxes)
    assert not quality_metrics.is_per_step_distribution(_softmax(logits[:, 0]))  # [N, C]: top-1's, not a sequence
    assert quality_metrics.resolve("auto", [logits, _softmax(logits)], None, 4) == "argmax_agreement"
    assert quality_metrics.resolve("auto", [logits], None, 4) == "cosine_similarity"
    assert quality_metrics.resolve("auto", [_softmax(logits)], np.zeros(4, np.int64), 4) == "top1_accuracy"


def test_a_metric_that_cannot_be_had_is_an_error_naming_the_field() -> None:
    with pytest.raises(DataError, match=r"slo\.qualityMetric.*needs labels"):
        quality_metrics.resolve("top1_accuracy", [np.zeros((2, 3), np.float32)], None, 2)
    with pytest.raises(DataError, match=r"slo\.qualityMetric.*classes on its last axis"):
        quality_metrics.resolve("argmax_agreement", [np.zeros((2,), np.float32)], None, 2)
    with pytest.raises(DataError, match=r"no quality metric plugin 'absent'.*metainfer\.quality_metrics"):
        quality_metrics.resolve("plugin:absent", [np.zeros((2, 3), np.float32)], None, 2)


def test_a_sample_counts_only_when_every_step_keeps_fp32s_argmax() -> None:
    reference = _softmax(RNG.standard_normal((10, 6, 5)))
    close = reference + RNG.standard_normal(reference.shape) * 1e-6  # cosine ~1, no argmax moves
    one_step = reference.copy()
    top = reference[3, 2].argmax()
    one_step[3, 2, (top + 1) % 5] = reference[3, 2, top] + 0.01  # one step of one line reads another character
    ref = Reference([reference], None, None, metric="argmax_agreement")
    assert quality_of([close], ref).value == 1.0
    moved = quality_of([one_step], ref)
    assert moved.metric == "argmax_agreement" and moved.value == pytest.approx(0.9) and moved.drop == pytest.approx(0.1)
    cosine = quality_of([one_step], Reference([reference], None, None)).value
    assert cosine > 0.99, "cosine hides what argmax agreement sees"
    mask = np.ones((10, 6), np.int64)
    mask[3, 2] = 0  # that step is padding: not compared
    assert quality_metrics.argmax_agreement([one_step], [reference], mask) == 1.0
    assert quality_of([one_step[:3]], ref.head(3)).value == 1.0 and ref.head(3).metric == "argmax_agreement"


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package the platform installed in the image, offering a metric under the entry point group."""
    (tmp_path / "lines_metric.py").write_text(
        textwrap.dedent(
            """
            import numpy as np

            def exact_lines(outputs, reference):
                return float(np.mean(np.all(np.argmax(outputs[0], -1) == np.argmax(reference[0], -1), axis=1)))

            def broken(outputs, reference):
                raise ZeroDivisionError("the plugin's own bug")
            """
        )
    )
    info = tmp_path / "lines_metric-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lines-metric\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[metainfer.quality_metrics]\nexact_lines = lines_metric:exact_lines\nbroken = lines_metric:broken\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    quality_metrics.user_metric.cache_clear()
    yield "exact_lines"
    quality_metrics.user_metric.cache_clear()
    sys.modules.pop("lines_metric", None)


def test_a_platforms_metric_is_found_by_entry_point_and_its_failures_are_its_own(plugin: str) -> None:
    reference = _softmax(RNG.standard_normal((4, 3, 5)))
    changed = reference.copy()
    changed[0, 0] = changed[0, 0][::-1] + np.arange(5)  # another argmax on line 0
    assert quality_metrics.resolve(f"plugin:{plugin}", [reference], None, len(reference)) == f"plugin:{plugin}"
    got = quality_of([changed], Reference([reference], None, None, metric=f"plugin:{plugin}"))
    assert (got.metric, got.name, got.reference, got.value) == ("user_metric", plugin, 1.0, 0.75)
    with pytest.raises(DataError, match="plugin 'broken' raised ZeroDivisionError: the plugin's own bug"):
        quality_of([changed], Reference([reference], None, None, metric="plugin:broken"))
    with pytest.raises(DataError, match="installed: broken, exact_lines"):
        quality_metrics.user_metric("typo")


def _recogniser(steps: int = 12, features: int = 16, classes: int = 20) -> bytes:
    """A CTC-style head: per-step features through a linear layer and a softmax over the characters."""
    weights = RNG.standard_normal((features, classes)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        ],
        "recogniser",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", steps, features])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["n", steps, classes])],
        [onnx.numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def test_an_adaptation_of_a_sequence_classifier_budgets_lines_not_cosine(
    tmp_path: Path, quick_profile: HardwareProfile
) -> None:
    base = _recogniser()
    path = tmp_path / "recogniser.onnx"
    path.write_bytes(base)
    info = inspect_model(path)
    data = Dataset(inputs={"x": RNG.standard_normal((64, 12, 16)).astype(np.float32)})
    reference = make_reference(create_session(base, Recipe()), data, 1)
    assert reference.metric == "argmax_agreement"
    settings = AdaptSettings(
        batch=4, budget_trials=3, algorithm="random", constraints=Constraints(max_quality_drop=0.02),
        overrides={"quantization": ("fp32", "int8_dynamic")},
    )  # fmt: skip
    report, _ = Adaptation(base, info, data, quick_profile, settings).run()
    measured = [t for t in report.trials if t.metrics is not None]
    assert measured and all(t.metrics.quality.metric == "argmax_agreement" for t in measured if t.metrics)
    assert report.best.metrics is not None and report.best.metrics.quality.drop <= 0.02


def _classifier(outputs: str) -> bytes:
    """x [N, 16] -> logits; ``outputs``: "ids" (an exported argmax, [N] int64), "ids+probabilities" (skl2onnx's
    order with zipmap off) or "binary" (one sigmoid probability per sample)."""
    weights = onnx.numpy_helper.from_array(RNG.standard_normal((16, 10)).astype(np.float32), "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["logits"]),
        helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        helper.make_node("ReduceMax", ["probabilities"], ["top"], keepdims=0, axes=[1]),
    ]
    declared = {
        "label": helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
        "probabilities": helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10]),
        "top": helper.make_tensor_value_info("top", TensorProto.FLOAT, ["N"]),
    }
    names = {
        "ids": ["label"],
        "ids+probabilities": ["label", "probabilities"],
        "binary": ["top"],
        "probabilities": ["probabilities"],
    }[outputs]
    graph = helper.make_graph(
        nodes, "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [declared[name] for name in names], [weights],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("outputs", ["ids", "ids+probabilities"])
def test_top1_reads_predicted_class_ids_as_ids(outputs: str) -> None:
    """An output of class ids (an exported argmax; skl2onnx's ``label``, first) was read as scores: the argmax of
    one column is always class 0, so FP32 "scored" the share of label 0 (0.16 for a 0.92 classifier) and no
    variant's accuracy meant anything."""
    session = create_session(_classifier(outputs), Recipe())
    x = RNG.standard_normal((64, 16)).astype(np.float32)
    predicted = session.run(None, {"x": x})[0]
    labels = predicted.copy()
    labels[:8] = (labels[:8] + 1) % 10  # 56 of 64 right
    reference = make_reference(session, Dataset({"x": x}, labels), 8)
    assert reference.metric == "top1_accuracy" and reference.accuracy == pytest.approx(56 / 64)
    assert reference.label_output() == 0
    wrong = [o.copy() for o in reference.outputs]
    wrong[0][8:16] = (wrong[0][8:16] + 1) % 10
    assert quality_of(wrong, reference).drop == pytest.approx(8 / 64)


def test_one_float_per_sample_is_no_top1_auto_compares_by_relative_error_and_asking_for_it_names_the_field() -> None:
    session = create_session(_classifier("binary"), Recipe())
    data = Dataset({"x": RNG.standard_normal((16, 16)).astype(np.float32)}, np.zeros(16, np.int64))
    assert make_reference(session, data, 8).metric == "relative_l2_similarity"
    with pytest.raises(DataError, match=r"slo.qualityMetric: top1_accuracy needs .* predicted class ids"):
        make_reference(session, data, 8, "top1_accuracy")


@pytest.mark.parametrize(
    ("shift", "hint"), [(1, "If they count from 1, subtract 1"), (-3, "")], ids=["one-based", "negative"]
)
def test_labels_outside_the_classes_the_model_scores_are_refused(shift: int, hint: str) -> None:
    """Found with labels counted from 1: no label matched an argmax, FP32 scored top-1 0.0, every variant "kept"
    it with a drop of 0.0, and the accuracy budget guarded nothing."""
    session = create_session(_classifier("ids+probabilities"), Recipe())
    x = np.random.default_rng(1).standard_normal((30, 16)).astype(np.float32)
    data = Dataset({"x": x}, np.arange(30) % 10 + shift)
    with pytest.raises(DataError, match=r"labels: they run from .* scores 10 classes \(0 to 9\)") as err:
        make_reference(create_session(_classifier("probabilities"), Recipe()), data, 8)
    assert hint in str(err.value)
    # Class ids the model outputs say nothing of how many classes there are: top-1 reads them as they are.
    assert make_reference(session, data, 8).accuracy is not None


def _binary_classifier() -> bytes:
    """A CTR or fraud model's head: one probability per sample."""
    weights = helper.make_tensor("W", TensorProto.FLOAT, [16, 1], RNG.standard_normal(16).astype(np.float32).tolist())
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["z"]), helper.make_node("Sigmoid", ["z"], ["p"])],
        "binary", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 1])], [weights],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


def test_one_value_per_sample_is_compared_by_its_relative_error_not_by_its_sign() -> None:
    """A per-sample cosine of one number is its sign: a binary classifier answering 0.99 for everyone, or half
    its probabilities, scored cosine 1.0000 (drop 0) and the quality budget guarded nothing."""
    session = create_session(_binary_classifier(), Recipe())
    data = Dataset({"x": np.random.default_rng(2).standard_normal((40, 16)).astype(np.float32)})
    reference = make_reference(session, data, 8)
    assert reference.metric == "relative_l2_similarity"
    (p,) = reference.outputs
    assert quality_of([p.copy()], reference).drop == 0.0
    assert quality_of([p * 0.5], reference).drop == pytest.approx(0.5)
    assert quality_of([np.full_like(p, 0.99)], reference).drop > 0.3
    assert quality_of([p * 1.004], reference).drop == pytest.approx(0.004, abs=1e-6)  # within a 0.01 budget
    assert quality_of([np.full_like(p, np.nan)], reference).value == -1.0


def test_a_one_value_output_beside_class_scores_counts_by_its_relative_error_in_the_cosine() -> None:
    logits = np.random.default_rng(3).standard_normal((20, 5)).astype(np.float32)
    value = np.random.default_rng(4).random((20, 1)).astype(np.float32)
    reference = Reference([logits, value], None, None, metric="cosine_similarity", samples=20)
    assert quality_of([logits, value], reference).drop == 0.0
    halved = quality_of([logits, value * 0.5], reference)
    assert halved.metric == "cosine_similarity" and halved.drop == pytest.approx(0.25)  # mean of 0 and 0.5


def test_relative_l2_needs_a_float_output_and_a_policy_may_ask_for_it() -> None:
    from metainfer.core.api.policy import Slo

    with pytest.raises(DataError, match="relative_l2_similarity compares float outputs"):
        quality_metrics.resolve("relative_l2_similarity", [np.zeros((4,), np.int64)], None, 4)
    boxes = np.ones((4, 4), np.float32)  # box regressions: a cosine misses their scale, so a policy may choose it
    assert quality_metrics.resolve("relative_l2_similarity", [boxes], None, 4) == "relative_l2_similarity"
    assert (
        Slo.model_validate({"latencyP95Ms": 10, "qualityMetric": "relative_l2_similarity"}).quality_metric
        == "relative_l2_similarity"
    )


def test_a_variant_answering_zeros_is_not_a_perfect_cosine() -> None:
    """The cosine took a zero product of norms for "both zero": a variant that answered zeros scored 1.0."""
    from metainfer.core.engine.reference import mean_cosine

    fp32 = np.random.default_rng(5).standard_normal((6, 10)).astype(np.float32)
    assert mean_cosine(np.zeros_like(fp32), fp32) == 0.0
    assert mean_cosine(fp32, np.zeros_like(fp32)) == 0.0
    assert mean_cosine(np.zeros_like(fp32), np.zeros_like(fp32)) == 1.0
    assert mean_cosine(fp32, fp32) == pytest.approx(1.0)


def test_infinities_fp32_has_too_are_left_out_and_new_ones_count_against() -> None:
    """Log-probabilities of masked classes are -inf in FP32 and in a faithful variant: not a NaN, not a -1."""
    from metainfer.core.engine.reference import mean_cosine

    fp32 = np.log(_softmax(np.random.default_rng(6).standard_normal((4, 8)))).astype(np.float32)
    fp32[:, 0] = -np.inf
    assert mean_cosine(fp32.copy(), fp32) == pytest.approx(1.0)
    assert quality_metrics.relative_l2_similarity(fp32.copy(), fp32) == pytest.approx(1.0)
    spoiled = fp32.copy()
    spoiled[0, 3] = -np.inf  # an infinity FP32 does not have
    assert mean_cosine(spoiled, fp32) == pytest.approx(0.5, abs=0.01)  # that sample -1, the others 1
    assert quality_metrics.relative_l2_similarity(spoiled, fp32) == -1.0


def test_labels_a_chosen_metric_does_not_read_are_not_checked() -> None:
    session = create_session(_classifier("probabilities"), Recipe())
    x = np.random.default_rng(1).standard_normal((30, 16)).astype(np.float32)
    data = Dataset({"x": x}, np.arange(30) % 10 + 1)  # one-based, but cosine does not read them
    assert make_reference(session, data, 8, "cosine_similarity").metric == "cosine_similarity"
