"""Offline transformer fusion with ONNX Runtime's transformer optimizer.

ORT's online optimizer already fuses much of a BERT graph, but fusing offline
first (Attention, SkipLayerNormalization, BiasGelu, EmbedLayerNormalization)
lets the quantizer see whole attention blocks and emit QAttention, which the
online path cannot do after quantization has split the MatMuls.
"""

from __future__ import annotations

import logging

import onnx
from onnx import helper

from metainfer.core.engine.transforms.attention import recognise_attention

MS_DOMAIN = "com.microsoft"
_ORT_FUSION_LOGGERS = ("onnxruntime.transformers", "fusion_", "onnx_model", "optimizer")


def fuse_transformer(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.transformers.optimizer import optimize_model

    # The optimizer logs every fusion at INFO/WARNING (its modules log under their bare names, e.g.
    # "fusion_attention"); a user sees the result in the report.
    for name in [*logging.root.manager.loggerDict, "onnxruntime.transformers"]:
        if name.startswith(_ORT_FUSION_LOGGERS):
            logging.getLogger(name).setLevel(logging.ERROR)
    # opt_level=0: Python fusions only, so the result does not depend on this
    # machine's ORT graph optimizations and stays portable and deterministic.
    working = onnx.ModelProto()
    working.CopyFrom(model)  # the optimizer rewrites the graph it is given in place
    optimized = optimize_model(working, model_type="bert", num_heads=0, hidden_size=0, opt_level=0)
    fused: onnx.ModelProto = optimized.model
    # The optimizer emits com.microsoft ops but leaves the opset import to its save path.
    domains = {n.domain for n in fused.graph.node}
    if MS_DOMAIN in domains and not any(o.domain == MS_DOMAIN for o in fused.opset_import):
        fused.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    if any(n.op_type == "Softmax" for n in fused.graph.node):
        # ORT's patterns missed some attention (other exporters, newer transformers): recognise it ourselves.
        fused = recognise_attention(fused)
    return fused
