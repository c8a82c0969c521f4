"""Which layers lose the most quality when quantized: the input to mixed precision.

Each quantizable layer is quantized alone (everything else stays float) and the
quality drop against FP32 is measured on a small sample; layers are ranked by
that drop. Keeping the top-k in float then buys back most of the lost quality
for a small share of the speed. Only the ``max_layers`` largest layers (by
weight count) are probed, which bounds the cost on deep conv nets; the rest are
ranked after them by size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import onnx
from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.recipe import WEIGHT_RANKING, QuantizationSpec, Quantizer, Recipe, TransformSpec, WeightSpec
from metainfer.core.engine.reference import Reference, batch_major, quality_of, run_all
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.transforms import build_variant, quantizable_nodes
from metainfer.core.engine.transforms.build import ensure_node_names

ProgressFn = Callable[[int, int, str], None]
Validated = tuple[float, list[float]]


class LayerSensitivity(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node: str
    op_type: str
    weights: int = Field(ge=0)
    quality_drop: float | None = Field(None, description="None when the layer was not probed.")


class SensitivityReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: str
    samples: int
    layers: list[LayerSensitivity] = Field(description="Most sensitive first.")
    quantizer: Quantizer = Field(
        "onnxruntime",
        description="Whose int8 the ranking is for: onnxruntime (each layer quantized alone, its drop measured) or"
        " nncf (NNCF's accuracy-controlled quantization: what it reverted to float first).",
    )
    kept_to_meet_budget: list[str] | None = Field(
        None,
        description="nncf: the operations its accuracy control reverted to float to keep the quality drop within"
        " the budget (empty: its plain int8 already met it); None for onnxruntime.",
    )

    def ranked(self) -> list[str]:
        return [layer.node for layer in self.layers]


def analyse(
    base: bytes,
    mode: str,
    calibration: Dataset,
    quality_data: Dataset,
    reference: Reference,
    batch: int,
    max_layers: int = 24,
    on_step: ProgressFn | None = None,
) -> SensitivityReport:
    model = onnx.load_from_string(base)
    ensure_node_names(model)
    sizes = _weight_counts(model)
    kinds = {n.name: n.op_type for n in model.graph.node}
    nodes = quantizable_nodes(model, mode)
    probed = sorted(nodes, key=lambda n: -sizes.get(n, 0))[:max_layers]
    rest = [n for n in nodes if n not in probed]
    probe_recipe = Recipe(batch=batch)
    layers: list[LayerSensitivity] = []
    for i, node in enumerate(probed):
        if on_step:
            on_step(i, len(probed), node)
        others = tuple(n for n in nodes if n != node)
        spec = _alone(mode, others)
        variant = build_variant(base, spec, calibration)
        outputs = run_all(create_session(variant, probe_recipe), quality_data, batch)
        drop = quality_of(outputs, reference).drop
        layers.append(LayerSensitivity(node=node, op_type=kinds[node], weights=sizes.get(node, 0), quality_drop=drop))
    if on_step:
        on_step(len(probed), len(probed), "done")
    layers.sort(key=lambda layer: (-(layer.quality_drop or 0.0), -layer.weights, layer.node))
    layers += [
        LayerSensitivity(node=n, op_type=kinds[n], weights=sizes.get(n, 0))
        for n in sorted(rest, key=lambda n: (-sizes.get(n, 0), n))
    ]
    return SensitivityReport(mode=mode, samples=quality_data.n_samples, layers=layers)


def accuracy_control(
    base: bytes,
    calibration: Dataset,
    quality_data: Dataset,
    reference: Reference,
    batch: int,
    max_quality_drop: float,
    max_kept: int,
) -> SensitivityReport:
    """The ranking of NNCF's static int8: the operations its accuracy control keeps in float to stay within
    ``max_quality_drop`` on ``quality_data`` (in the policy's own metric, against FP32's ``reference``) first,
    largest first, then every other quantizable layer by size. Keeping k of them in float keeps what the control
    chose when k covers it."""
    from metainfer.core.engine.transforms.quantize import calibration_batch, prepared_for_static_int8
    from metainfer.core.engine.transforms.quantize_nncf import feeds_of, kept_in_float_by_accuracy_control

    model = onnx.load_from_string(base)
    ensure_node_names(model)
    sizes = _weight_counts(model)
    kinds = {n.name: n.op_type for n in model.graph.node}
    session_recipe = Recipe(batch=batch)
    items = [(feed, rows) for feed, rows in quality_data.batches(batch)]

    def validate(candidate: onnx.ModelProto, chosen: Iterable[tuple[dict[str, np.ndarray], slice]]) -> Validated:
        """The metric on the ``chosen`` batches (their mean weighted by samples) and each batch's own value."""
        session = create_session(candidate.SerializeToString(), session_recipe)
        values, weights = [], []
        for feed, rows in chosen:
            outputs = [batch_major(o, rows.stop - rows.start) for o in session.run(None, feed)]
            values.append(quality_of(outputs, reference.part(rows.start, rows.stop)).value)
            weights.append(rows.stop - rows.start)
        return float(np.average(values, weights=weights)), values

    kept = kept_in_float_by_accuracy_control(
        prepared_for_static_int8(model),
        feeds_of(calibration, calibration_batch(model, calibration)),
        items,
        validate,
        max_quality_drop,
        max_kept,
    )
    first = sorted(kept, key=lambda n: (-sizes.get(n, 0), n))
    rest = sorted(
        (n for n in quantizable_nodes(model, "int8_static") if n not in kept), key=lambda n: (-sizes.get(n, 0), n)
    )
    layers = [LayerSensitivity(node=n, op_type=kinds.get(n, "?"), weights=sizes.get(n, 0)) for n in [*first, *rest]]
    return SensitivityReport(
        mode="int8_static", samples=quality_data.n_samples, layers=layers, quantizer="nncf", kept_to_meet_budget=first
    )


def _alone(mode: str, others: tuple[str, ...]) -> TransformSpec:
    """The variant that quantizes one layer alone: every other layer of ``mode`` kept in float."""
    if mode == WEIGHT_RANKING:  # the most aggressive weight-only setting the search offers: 4 bits, blocks of 128
        return TransformSpec(weights=WeightSpec(bits=4, keep_float=others))
    # ``mode`` arrives as the search point's string; validating it is what narrows it to a QuantizationMode.
    quantization = QuantizationSpec.model_validate({"mode": mode, "per_channel": True, "keep_float": others})
    return TransformSpec(quantization=quantization)


def _weight_counts(model: onnx.ModelProto) -> dict[str, int]:
    inits = {t.name: int(np.prod(t.dims)) if t.dims else 1 for t in model.graph.initializer}
    return {n.name: sum(inits.get(i, 0) for i in n.input) for n in model.graph.node}
