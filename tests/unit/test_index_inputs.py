"""Which inputs index a constant table, found in graphs built here: the checks serving applies before any runtime."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from metainfer.core.engine.index_inputs import IndexBound, index_bounds


def _model(nodes: list[onnx.NodeProto], inputs: list[str], initializers: list[onnx.TensorProto]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"]) for name in inputs],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _table(name: str, rows: int, width: int = 4) -> onnx.TensorProto:
    return numpy_helper.from_array(np.zeros((rows, width), np.float32), name)


def test_token_and_type_ids_that_feed_a_gather_are_bounded_by_their_tables() -> None:
    model = _model(
        [
            helper.make_node("Gather", ["words", "input_ids"], ["w"]),
            helper.make_node("Gather", ["types", "token_type_ids"], ["t"]),
            helper.make_node("Add", ["w", "t"], ["out"]),
        ],
        ["input_ids", "token_type_ids", "attention_mask"],
        [_table("words", 30522), _table("types", 2)],
    )
    assert index_bounds(model) == {
        "input_ids": IndexBound("input_ids", 30522, "words"),
        "token_type_ids": IndexBound("token_type_ids", 2, "types"),
    }


def test_ids_reach_the_table_through_value_preserving_ops_and_a_dequantized_table() -> None:
    """A cast, an unsqueeze and a reshape keep every id; the table is an int8 initializer dequantized first."""
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "scale")
    zero = numpy_helper.from_array(np.array(0, np.int8), "zero")
    quantized = numpy_helper.from_array(np.zeros((1000, 8), np.int8), "words_q")
    shape = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    model = _model(
        [
            helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
            helper.make_node("Reshape", ["ids32", "flat"], ["ids_flat"]),
            helper.make_node("DequantizeLinear", ["words_q", "scale", "zero"], ["words"]),
            helper.make_node("Gather", ["words", "ids_flat"], ["out"]),
        ],
        ["input_ids"],
        [quantized, scale, zero, shape],
    )
    assert index_bounds(model) == {"input_ids": IndexBound("input_ids", 1000, "words_q")}


def test_the_smallest_table_an_input_indexes_bounds_it_and_the_axis_counts() -> None:
    model = _model(
        [
            helper.make_node("Gather", ["big", "ids"], ["a"]),
            helper.make_node("Gather", ["wide", "ids"], ["b"], axis=1),  # the table's columns: 7 of them
            helper.make_node("Add", ["a", "b"], ["out"]),
        ],
        ["ids"],
        [_table("big", 500), _table("wide", 3, width=7)],
    )
    assert index_bounds(model) == {"ids": IndexBound("ids", 7, "wide")}


def test_what_the_graph_does_not_fix_is_not_guessed() -> None:
    """Ids offset by an Add, a table computed at run time, an input used as the data of a Gather, and an old-style
    export that lists its table as an input: none is bounded."""
    offset = numpy_helper.from_array(np.array(2, np.int64), "two")
    model = _model(
        [
            helper.make_node("Add", ["positions", "two"], ["shifted"]),
            helper.make_node("Gather", ["table", "shifted"], ["a"]),
            helper.make_node("Relu", ["computed_src"], ["computed"]),
            helper.make_node("Gather", ["computed", "ids"], ["b"]),
            helper.make_node("Gather", ["data", "index"], ["c"]),
            helper.make_node("Concat", ["a", "b", "c"], ["out"], axis=0),
        ],
        ["positions", "ids", "data", "computed_src", "table"],
        [_table("table", 10), offset, numpy_helper.from_array(np.array(0, np.int64), "index")],
    )
    assert index_bounds(model) == {}


def test_onnx_runtimes_fused_embedding_bounds_words_segments_and_positions() -> None:
    node = helper.make_node(
        "EmbedLayerNormalization",
        ["input_ids", "segment_ids", "words", "positions", "segments", "gamma", "beta", "", "position_ids"],
        ["out", "mask_index"],
        domain="com.microsoft",
    )
    model = _model(
        [node],
        ["input_ids", "segment_ids", "position_ids"],
        [_table("words", 8192), _table("positions", 512), _table("segments", 2)],
    )
    bounds = index_bounds(model)
    assert {name: bound.rows for name, bound in bounds.items()} == {
        "input_ids": 8192,
        "segment_ids": 2,
        "position_ids": 512,
    }
