"""Hardware profile of the local machine, measured by micro-benchmarks.

``load_or_measure`` is the entry point: it returns the cached profile of this
machine's fingerprint while it is fresh, and measures (then caches) otherwise.

The measuring code needs onnx and onnxruntime (about 40 MB of RSS); the operator
imports this package for its types and never measures, so ``measure_profile``
and ``OnStep`` load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from metainfer.core.engine.profile.cache import (
    DEFAULT_CACHE_DIR,
    DEFAULT_MAX_AGE_S,
    load_cached,
    load_or_measure,
    save,
)
from metainfer.core.engine.profile.fingerprint import detect_machine, fingerprint
from metainfer.core.engine.profile.types import (
    CPU_PROVIDER,
    SUMMARY_COLUMNS,
    BenchConfig,
    Dtype,
    HardwareProfile,
    MachineInfo,
    OpenVinoAvailability,
    OpSupport,
    SupportStatus,
    int8_variant,
)

if TYPE_CHECKING:
    from metainfer.core.engine.profile.measure import OnStep, measure_profile


def __getattr__(name: str) -> Any:
    if name not in ("OnStep", "measure_profile"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("metainfer.core.engine.profile.measure"), name)
    globals()[name] = value
    return value


__all__ = [
    "CPU_PROVIDER",
    "DEFAULT_CACHE_DIR",
    "DEFAULT_MAX_AGE_S",
    "SUMMARY_COLUMNS",
    "BenchConfig",
    "Dtype",
    "HardwareProfile",
    "MachineInfo",
    "OnStep",
    "OpSupport",
    "OpenVinoAvailability",
    "SupportStatus",
    "detect_machine",
    "fingerprint",
    "int8_variant",
    "load_cached",
    "load_or_measure",
    "measure_profile",
    "save",
]
