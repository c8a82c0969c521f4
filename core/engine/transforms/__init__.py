"""Deterministic model transforms: base model + TransformSpec -> variant bytes."""

from metainfer.core.engine.transforms.build import build_variant, quantizable_nodes
from metainfer.core.engine.transforms.padding import (
    PaddingNotRemovable,
    can_remove_padding,
    check_padding_removable,
    remove_padding,
)

__all__ = [
    "PaddingNotRemovable",
    "build_variant",
    "can_remove_padding",
    "check_padding_removable",
    "quantizable_nodes",
    "remove_padding",
]
