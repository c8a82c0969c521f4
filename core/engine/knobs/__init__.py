"""The search knobs: each dimension of the joint search space, declared once.

A ``Knob`` says everything the rest of metainfer needs to know about one
dimension: the values it takes for a model on a machine, the rules that
rule points out (against the hardware profile and against other knobs), the
Recipe field its value lands in, and how a policy may restrict it
(``spec.search.searchSpace``). Derived from ``KNOBS``:

- ``candidates.build_space``: one ``Dimension`` per knob, in ``KNOBS`` order,
  and a constraint that is every knob's rules together;
- ``candidates.recipe_for``: each knob writes its Recipe field(s);
- ``core.api.policy.SearchSpaceOverrides``: one optional field per knob with an
  ``override``, so the CRD schema follows the declarations;
- ``core.control.runstatus``: policy field -> dimension, and the choices a
  policy's value allows;
- ``search.prior.builtin_prior``: each dimension's spread and known effects,
  what the search believes of the knob before measuring.

Adding a knob is one declaration in the module of its area (quantization,
graph, session), appended to that module's ``KNOBS``, plus its test; a new
area (a runtime's own options, as knobs/openvino.py; weight-only quantization, knobs/weights.py) is one new module
added to the tuple below. The
order of ``KNOBS`` is the order of the space's dimensions, which seeded searches
depend on.

The operator imports this module (through the API types) and never builds a
space, so nothing here loads onnx, onnxruntime, numpy or the searchers.
"""

from __future__ import annotations

from metainfer.core.engine.knobs import (
    activations,
    graph,
    openvino,
    providers,
    quantization,
    quantizer,
    session,
    weights,
)
from metainfer.core.engine.knobs.base import (
    COMPUTE_OPS,
    DEFAULT_SPREAD,
    INT8_DYNAMIC_OPS,
    INT8_STATIC_CONV_OPS,
    INT8_STATIC_OPS,
    SLOW_VARIANT_FACTOR,
    ChoiceList,
    Knob,
    Override,
    SpaceContext,
    SpaceOptions,
    UpTo,
    check_knobs,
    overridable,
    point_rule,
)
from metainfer.core.engine.knobs.graph import FUSION, LAYOUT, PADDING
from metainfer.core.engine.knobs.openvino import OPENVINO_HINT, OPENVINO_PRECISION, OPENVINO_STREAMS, RUNTIME
from metainfer.core.engine.knobs.quantization import (
    ACTIVATION_TYPE,
    CALIBRATION,
    KEEP_FLOAT,
    PER_CHANNEL,
    QUANTIZATION,
    WEIGHT_TYPE,
    keep_count,
    unsupported_reason,
)
from metainfer.core.engine.knobs.session import (
    BATCH,
    EXECUTION_MODE,
    EXECUTION_PROVIDER,
    GRAPH_OPTIMIZATION_LEVEL,
    INTRA_OP_NUM_THREADS,
    thread_choices,
)
from metainfer.core.engine.recipe import INT8_MODES, QUANTIZATION_MODES

# Areas in a fixed order: the order of KNOBS is the order of the space's dimensions.
KNOBS: tuple[Knob, ...] = (
    *quantization.KNOBS,
    *graph.KNOBS,
    *session.KNOBS,
    *openvino.KNOBS,
    *quantizer.KNOBS,
    *activations.KNOBS,
    *providers.KNOBS,
    *weights.KNOBS,
)
check_knobs(KNOBS)


__all__ = [
    "ACTIVATION_TYPE",
    "BATCH",
    "CALIBRATION",
    "COMPUTE_OPS",
    "DEFAULT_SPREAD",
    "EXECUTION_MODE",
    "EXECUTION_PROVIDER",
    "FUSION",
    "GRAPH_OPTIMIZATION_LEVEL",
    "INT8_DYNAMIC_OPS",
    "INT8_MODES",
    "INT8_STATIC_CONV_OPS",
    "INT8_STATIC_OPS",
    "INTRA_OP_NUM_THREADS",
    "KEEP_FLOAT",
    "KNOBS",
    "LAYOUT",
    "OPENVINO_HINT",
    "OPENVINO_PRECISION",
    "OPENVINO_STREAMS",
    "PADDING",
    "PER_CHANNEL",
    "QUANTIZATION",
    "QUANTIZATION_MODES",
    "RUNTIME",
    "SLOW_VARIANT_FACTOR",
    "WEIGHT_TYPE",
    "ChoiceList",
    "Knob",
    "Override",
    "SpaceContext",
    "SpaceOptions",
    "UpTo",
    "check_knobs",
    "keep_count",
    "overridable",
    "point_rule",
    "thread_choices",
    "unsupported_reason",
]
