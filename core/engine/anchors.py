"""The peers a user would otherwise run, measured first: the search then never ships slower than them.

Each runtime and quantizer in the space has a configuration its users reach for without any search: OpenVINO's CPU
plugin on the FP32 model, OpenVINO with NNCF's default int8, and each runtime's int4 weights. With a few trials to
spend in a space of thousands of points, a search can miss them (16 trials gave NNCF one on Inception v1, where
OpenVINO + NNCF was 1.35x faster than the pick). Measuring those that the space allows first, as ordinary trials
the searcher is told about, makes "at least as fast as that peer, at equal quality budget" hold by construction,
and gives the surrogate one point per runtime to learn from.

ONNX Runtime's own recipe for transformers joins them: attention fused by its transformer optimizer and dynamic
int8 per channel, with the engine's padding removal where the model allows it. It is the one that led every
export flavour of the sentence encoder on 2026-12-01 (3.1-4.0x ORT FP32); once the space also spanned OpenVINO,
a 40-trial search on one flavour tried dynamic int8 once and shipped NNCF on OpenVINO at 58.6 ms where this
recipe ran about 30 ms on its sibling export. A model without attention has no such point in its space.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from metainfer.core.engine.knobs import KNOBS, Knob
from metainfer.core.engine.knobs.base import as_int
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.search.space import Point, Space

# (transform, session) of each peer, as recipe fields.
PEERS: tuple[tuple[dict[str, Any], dict[str, Any]], ...] = (
    ({}, {"runtime": "openvino"}),
    ({"quantization": {"mode": "int8_static", "quantizer": "nncf"}}, {"runtime": "openvino"}),
    # The low-bit weights each runtime's users reach for: NNCF's int4 (symmetric, groups of 128, its default) on
    # OpenVINO, and ONNX Runtime's MatMulNBits int4 in blocks of 32 with int8 compute (onnxruntime-genai's CPU
    # default). On bert_mini the former ran 1.75x faster at batch 8 than a 24-trial search's pick that missed it.
    ({"weights": {"bits": 4, "method": "nncf", "block_size": 128, "symmetric": True}}, {"runtime": "openvino"}),
    ({"weights": {"bits": 4, "block_size": 32, "accuracy_level": 4}}, {"runtime": "onnxruntime"}),
)
# Alternatives, best first: the first that the space allows is measured (padding removal needs a mask input).
TRANSFORMER_RECIPES: tuple[tuple[dict[str, Any], dict[str, Any]], ...] = (
    (
        {"fusion": "transformer", "padding": "remove", "quantization": {"mode": "int8_dynamic", "per_channel": True}},
        {"runtime": "onnxruntime"},
    ),
    (
        {"fusion": "transformer", "quantization": {"mode": "int8_dynamic", "per_channel": True}},
        {"runtime": "onnxruntime"},
    ),
)


def anchor_points(space: Space, batch: int, cores: int, *, knobs: Sequence[Knob] = KNOBS) -> list[Point]:
    """The peers' points at ``batch`` that ``space`` allows (a peer the hardware, the policy or the model rules out
    is left out), in order, then the first transformer recipe it allows, with one thread per physical core (the
    runtimes' own default) where the space offers that, else its nearest thread count."""
    offered = next((d.choices for d in space.dimensions if d.name == "intra_op_num_threads"), (cores,))
    counts = [as_int(t) for t in offered]
    threads = min(counts, key=lambda t: (abs(t - cores), -t))

    def allowed(transform: dict[str, Any], session: dict[str, Any]) -> Point | None:
        recipe = Recipe.model_validate(
            {"transform": transform, "session": {**session, "intra_op_num_threads": threads}, "batch": batch}
        )
        point = {knob.name: knob.read(recipe) for knob in knobs}
        return point if space.contains(point) and space.is_allowed(point) else None

    points = [p for p in (allowed(*peer) for peer in PEERS) if p is not None]
    transformer = next((p for p in (allowed(*r) for r in TRANSFORMER_RECIPES) if p is not None), None)
    return points + ([transformer] if transformer is not None else [])
