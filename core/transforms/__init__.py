"""Deterministic model transforms: base model + TransformSpec -> variant bytes."""

from metainfer.core.transforms.build import build_variant, quantizable_nodes

__all__ = ["build_variant", "quantizable_nodes"]
