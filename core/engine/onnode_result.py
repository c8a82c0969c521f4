"""What a provisional pod's on-node check found (core.engine.onnode_check measures it).

Apart from the measuring, which needs ONNX Runtime, because the operator reads these results from pods and never
imports ONNX Runtime.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.engine.quality_choice import CHOICE_PATTERN

REASON_LIMIT = 400  # the result travels in a termination message (4096 bytes at most) and into status

Serves = Literal["variant", "fp32"]


class CheckBudget(BaseModel):
    """What the variant must meet on this node: the policy's SLO."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_quality_drop: float = Field(ge=0, le=1)
    latency_p95_ms: float = Field(gt=0)
    quality_metric: str = Field("auto", pattern=CHOICE_PATTERN, description="The metric the drop is written in.")


class OnNodeCheck(BaseModel):
    """What a provisional pod found on its node, and what it therefore serves."""

    model_config = ConfigDict(extra="forbid")

    serves: Serves = Field(description="variant: the donor's variant passed; fp32: the FP32 model instead.")
    variant_sha256: str | None = Field(None, max_length=64, description="The donor's variant that was checked.")
    quality_metric: str | None = Field(None, max_length=64)
    quality_drop: float | None = Field(None, description="Measured on this node vs FP32 on the same samples.")
    samples: int = Field(0, ge=0)
    latency_p95_ms: float | None = Field(None, description="The variant's p95 per batch on this node, ms.")
    budget: CheckBudget
    reason: str = Field("", max_length=REASON_LIMIT, description="Why the variant was refused (empty: it passed).")

    def describe(self) -> str:
        """One line for a status message or a log."""
        measured = []
        if self.quality_drop is not None:
            measured.append(f"quality drop {self.quality_drop:.4f} (budget {self.budget.max_quality_drop:g})")
        if self.latency_p95_ms is not None:
            measured.append(f"p95 {self.latency_p95_ms:.2f} ms (SLO {self.budget.latency_p95_ms:g} ms)")
        found = ", ".join(measured) or "nothing measured"
        if self.serves == "variant":
            return f"on-node check passed: {found}"
        return f"on-node check refused the variant ({self.reason}; {found}): serving FP32"


def bounded(text: str, limit: int = REASON_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
