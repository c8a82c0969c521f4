"""HardwareClass: the inference-relevant identity of a group of interchangeable nodes.

A class is identified by what changes kernels or their speed: accelerator
vendor, product, memory, compute capability, driver and runtime versions, CPU
architecture and ISA features. Its fingerprint hashes exactly these fields in a
canonical form, so it is stable across processes and Python versions, and a
driver upgrade yields a new class (and therefore a re-adaptation).

It is an API type (policies, runs and profiles carry it); deriving classes from
node labels is the control layer's job (metainfer.core.control.hardware).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator
from pydantic.alias_generators import to_camel

AcceleratorVendor = Literal["nvidia", "amd", "intel", "huawei", "cpu"]
ACCELERATOR_VENDORS: tuple[str, ...] = ("nvidia", "amd", "intel", "huawei", "cpu")
FINGERPRINT_PATTERN = r"^[a-f0-9]{16}$"
DESCRIPTION_MAX = 128


class HardwareClass(BaseModel):
    """Inference-relevant identity of a group of nodes (vendor ``cpu`` means no accelerator)."""

    # camelCase on the wire like every API type, but frozen and hashable: classes are dict keys.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    vendor: AcceleratorVendor = Field(description="Accelerator vendor; cpu when the nodes have none.")
    product: str = Field(
        min_length=1,
        max_length=128,
        description="Accelerator product (e.g. NVIDIA-A100-SXM4-40GB) or CPU model for vendor cpu.",
    )
    memory_mib: int | None = Field(None, ge=0, alias="memoryMiB", description="Accelerator memory per device, MiB.")
    compute_capability: str | None = Field(
        None, max_length=32, description="Vendor compute capability, e.g. 8.0 (NVIDIA) or gfx90a (AMD)."
    )
    driver_version: str | None = Field(None, max_length=64, description="Accelerator driver version.")
    runtime_version: str | None = Field(
        None, max_length=64, description="Accelerator runtime version (CUDA, ROCm, CANN...)."
    )
    cpu_arch: str = Field("amd64", max_length=32, description="kubernetes.io/arch of the nodes.")
    cpu_features: tuple[Annotated[str, StringConstraints(min_length=1, max_length=64)], ...] = Field(
        (),
        max_length=64,
        description="Inference-relevant CPU features (e.g. AVX512VNNI), sorted and unique.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @field_validator("cpu_features")
    @classmethod
    def _canonical_features(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(set(value)))

    def fingerprint(self) -> str:
        """16 hex digits of sha256 over the canonical JSON of every identity field."""
        canonical = json.dumps(self.model_dump(mode="json", by_alias=False), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def description(self, limit: int = DESCRIPTION_MAX) -> str:
        """The class in words for people (kubectl columns, metric labels, dashboard legends), e.g.
        ``nvidia A100-SXM4-80GB 80 GiB, cc 8.0, driver 535.104.05`` or ``cpu Intel amd64 AVX2 AVX512VNNI``."""
        head = f"{self.vendor} {self.product}"
        if self.memory_mib:
            head += f" {self.memory_mib / 1024:g} GiB"
        details = [
            *([f"cc {self.compute_capability}"] if self.compute_capability else []),
            *([f"driver {self.driver_version}"] if self.driver_version else []),
            *([f"runtime {self.runtime_version}"] if self.runtime_version else []),
        ]
        if self.vendor == "cpu" or not details:
            details.append(" ".join([self.cpu_arch, *self.cpu_features]))
        text = ", ".join([head, *details])
        return text if len(text) <= limit else text[: limit - 1] + "…"

    def name(self) -> str:
        """A DNS-1123 label (<= 40 chars) a person can read: ``nvidia-a100-sxm4-40gb-1a2b3c4d``."""
        readable = re.sub(r"[^a-z0-9]+", "-", f"{self.vendor}-{self.product}".lower()).strip("-")
        return f"{readable[:31].rstrip('-')}-{self.fingerprint()[:8]}"
