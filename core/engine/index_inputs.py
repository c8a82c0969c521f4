"""Which model inputs are indices into a table, and how many rows that table has.

Token ids, position ids and token type ids feed a Gather over an embedding table. An id at or past the table's
size is an error in ONNX, but runtimes disagree on what they do with one: ONNX Runtime refuses the run, OpenVINO
answers with numbers (zeros, or another row's), and a dynamic batch shares the fate of its worst request. Serving
checks such inputs against their table before any runtime sees them (``agent.serve.protocol.check_inputs``), so the
same request gets the same answer whatever runtime a hardware class ships.

An input counts as an index when it reaches the indices of a Gather (or of ONNX Runtime's fused
EmbedLayerNormalization, or its 4-bit GatherBlockQuantized) only through operators that keep every value as it is
(Cast, Reshape, Unsqueeze...), and the table is a constant of the graph, so its size is known without running
anything. Anything else (ids offset by an Add, a table computed at run time) is left to the runtime: a bound the
graph does not fix is not guessed.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

import onnx

# Operators whose first input's every value reaches the output unchanged (in another shape or type): an index that
# passes through them is still checked against the table it ends at. Ops that drop values (Slice, Gather itself)
# are not here: checking values the runtime never sees would refuse requests it answers.
_VALUE_PRESERVING = frozenset({"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Transpose"})
# Producers a constant table may come through: a quantized table is dequantized before the Gather.
_TABLE_THROUGH = frozenset({"Cast", "Identity", "DequantizeLinear"})
# ONNX Runtime's fused embedding: (indices input, the table it indexes) by input position.
_EMBED_LAYER_NORM = ((0, 2), (1, 4), (8, 3))  # input_ids -> word, segment_ids -> segment, position_ids -> position


@dataclass(frozen=True)
class IndexBound:
    """Input ``input`` indexes the ``rows`` rows of ``table`` (an initializer's name): its values must lie in
    ``[-rows, rows)`` (ONNX's Gather counts negative indices from the end)."""

    input: str
    rows: int
    table: str


def index_bounds(model: onnx.ModelProto) -> dict[str, IndexBound]:
    """Every graph input that indexes a constant table, with the smallest table it indexes."""
    graph = model.graph
    constants = {t.name: tuple(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                constants[node.output[0]] = tuple(value.dims)
    producers = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    initializers = {t.name for t in graph.initializer}
    bounds: dict[str, IndexBound] = {}
    for graph_input in graph.input:
        if graph_input.name in initializers:  # an old-style export lists its weights as inputs too
            continue
        for rows, table in _tables_reached(graph_input.name, consumers, producers, constants):
            known = bounds.get(graph_input.name)
            if known is None or rows < known.rows:
                bounds[graph_input.name] = IndexBound(graph_input.name, rows, table)
    return bounds


def _tables_reached(
    start: str,
    consumers: dict[str, list[onnx.NodeProto]],
    producers: dict[str, onnx.NodeProto],
    constants: dict[str, tuple[int, ...]],
) -> list[tuple[int, str]]:
    """(rows, table) of every table that ``start``'s values index, unchanged."""
    found: list[tuple[int, str]] = []
    seen, queue = {start}, deque([start])
    while queue:
        tensor = queue.popleft()
        for node in consumers.get(tensor, []):
            if node.op_type in _VALUE_PRESERVING and node.input[0] == tensor:
                for out in node.output:
                    if out and out not in seen:
                        seen.add(out)
                        queue.append(out)
            elif node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == tensor:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                found.extend(_rows(node.input[0], axis, producers, constants))
            elif node.op_type == "GatherBlockQuantized" and len(node.input) > 1 and node.input[1] == tensor:
                # A 4-bit table (weight-only quantization's embeddings) packs two values a byte along its quantized
                # axis: its rows are whole along any other.
                attributes = {a.name: a.i for a in node.attribute}
                axis, packed = attributes.get("gather_axis", 0), attributes.get("quantize_axis", 1)
                if axis != packed:
                    found.extend(_rows(node.input[0], axis, producers, constants))
            elif node.op_type == "EmbedLayerNormalization":
                for position, table in _EMBED_LAYER_NORM:
                    if len(node.input) > max(position, table) and node.input[position] == tensor:
                        found.extend(_rows(node.input[table], 0, producers, constants))
    return found


def _rows(
    table: str, axis: int, producers: dict[str, onnx.NodeProto], constants: dict[str, tuple[int, ...]]
) -> list[tuple[int, str]]:
    """The size along ``axis`` of ``table`` when it is a constant (possibly cast or dequantized); else nothing."""
    name = table
    while name not in constants:
        node = producers.get(name)
        if node is None or node.op_type not in _TABLE_THROUGH or not node.input:
            return []
        name = node.input[0]
    dims = constants[name]
    if not dims or not -len(dims) <= axis < len(dims) or dims[axis] <= 0:
        return []
    return [(int(dims[axis]), name)]
