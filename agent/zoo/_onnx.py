"""ONNX versions shared by the models built here.

Opset 17 is the first with a native LayerNormalization, which is what a current
PyTorch export emits. Each model is stamped with the lowest IR version that can
carry its opset, so older runtimes load it too (the onnx package would otherwise
stamp its own, newer, default).
"""

from __future__ import annotations

from onnx import helper

OPSET = 17


def ir_version_for(opset: int) -> int:
    """The lowest IR version that can carry the default-domain ``opset``."""
    return int(helper.find_min_ir_version_for([helper.make_opsetid("", opset)]))


IR_VERSION = ir_version_for(OPSET)
