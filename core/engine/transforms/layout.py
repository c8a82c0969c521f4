"""NHWC convolutions for execution providers that prefer channels-last.

Each float Conv becomes Transpose(NCHW->NHWC) -> com.microsoft.NhwcConv ->
Transpose back. The model's interface stays NCHW; ORT's transpose optimizer
cancels the back-to-back transposes between consecutive convs. The CPU EP has
no float NhwcConv kernel, so the engine offers this layout only where the
hardware profile says NhwcConv runs natively.
"""

from __future__ import annotations

import onnx
from onnx import helper

MS_DOMAIN = "com.microsoft"
TO_NHWC = [0, 2, 3, 1]
TO_NCHW = [0, 3, 1, 2]


def to_nhwc(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes: list[onnx.NodeProto] = []
    changed = False
    for node in out.graph.node:
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        changed = True
        name = node.name or f"conv_{len(nodes)}"
        x_nhwc, y_nhwc = f"{name}/x_nhwc", f"{name}/y_nhwc"
        nodes.append(helper.make_node("Transpose", [node.input[0]], [x_nhwc], name=f"{name}/to_nhwc", perm=TO_NHWC))
        conv = helper.make_node("NhwcConv", [x_nhwc, *node.input[1:]], [y_nhwc], name=name, domain=MS_DOMAIN)
        conv.attribute.extend(node.attribute)
        nodes.append(conv)
        nodes.append(helper.make_node("Transpose", [y_nhwc], [node.output[0]], name=f"{name}/to_nchw", perm=TO_NCHW))
    if changed:
        del out.graph.node[:]
        out.graph.node.extend(nodes)
        if not any(o.domain == MS_DOMAIN for o in out.opset_import):
            out.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return out
