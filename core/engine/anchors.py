"""The peers a user would otherwise run, measured first: the search then never ships slower than them.

Each runtime and quantizer in the space has a configuration its users reach for without any search: OpenVINO's
CPU plugin on the FP32 model, and OpenVINO with NNCF's default int8. With a few trials to spend in a space of
thousands of points, a search can miss them (16 trials gave NNCF one on Inception v1, where OpenVINO + NNCF was
1.35x faster than the pick). Measuring those that the space allows first, as ordinary trials the searcher is
told about, makes "at least as fast as that peer, at equal quality budget" hold by construction, and gives the
surrogate one point per runtime to learn from.
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
)


def anchor_points(space: Space, batch: int, cores: int, *, knobs: Sequence[Knob] = KNOBS) -> list[Point]:
    """The peers' points at ``batch`` that ``space`` allows (a peer the hardware, the policy or the model rules out
    is left out), in order, with one thread per physical core (the runtimes' own default) where the space offers
    that, else its nearest thread count."""
    offered = next((d.choices for d in space.dimensions if d.name == "intra_op_num_threads"), (cores,))
    counts = [as_int(t) for t in offered]
    threads = min(counts, key=lambda t: (abs(t - cores), -t))
    points = []
    for transform, session in PEERS:
        recipe = Recipe.model_validate(
            {"transform": transform, "session": {**session, "intra_op_num_threads": threads}, "batch": batch}
        )
        point = {knob.name: knob.read(recipe) for knob in knobs}
        if space.contains(point) and space.is_allowed(point):
            points.append(point)
    return points
