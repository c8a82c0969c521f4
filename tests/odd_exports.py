"""Small ONNX models shaped like exports users bring that the bundled examples are not (shared by the tiers)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def detector(with_boxes: bool = True) -> bytes:
    """x [N, 16] -> boxes [N, 4] (one per sample) and the indices NonMaxSuppression keeps of them, [K, 3]: as many
    rows as the run kept, whatever its samples, as in a detector exported with its post-processing."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["boxes"]),
        helper.make_node("Unsqueeze", ["boxes", "zero"], ["batched"]),
        helper.make_node("ReduceSum", ["x", "one"], ["sums"], keepdims=0),
        helper.make_node("Sigmoid", ["sums"], ["probability"]),
        helper.make_node("Reshape", ["probability", "scores_shape"], ["scores"]),
        helper.make_node("NonMaxSuppression", ["batched", "scores", "keep", "iou", "threshold"], ["selected"]),
    ]
    outputs = [helper.make_tensor_value_info("selected", TensorProto.INT64, ["K", 3])]
    if with_boxes:
        outputs.insert(0, helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", 4]))
    initializers = [
        numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "W"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([1, 1, -1], np.int64), "scores_shape"),
        numpy_helper.from_array(np.array([5], np.int64), "keep"),
        numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
        numpy_helper.from_array(np.array([0.3], np.float32), "threshold"),
    ]
    graph = helper.make_graph(
        nodes, "detector", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])], outputs, initializers
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def unbatched_conv() -> bytes:
    """x [3, 8, 8] -> y [4, 8, 8]: a model that takes one image without a samples axis, as torchvision's detectors
    do ([3, H, W])."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Unsqueeze", ["x", "zero"], ["one_image"]),
        helper.make_node("Conv", ["one_image", "W"], ["features"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["features"], ["activated"]),
        helper.make_node("Squeeze", ["activated", "zero"], ["y"]),
    ]
    initializers = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
    ]
    graph = helper.make_graph(
        nodes, "unbatched", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8, 8])], initializers,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
