"""A decoder variant's quality against FP32 on real English text, teacher-forced.

The text is ``reference_text.txt``: prose paragraphs of the Python Language Reference ("Objects, values and
types", "Execution model", "Exceptions", "Truth value testing"), taken from CPython 3.11.7's
``pydoc_data.topics`` (PSF License 2.0), so it is on every machine without a download and never changes under a
run. Both models read the same token windows; at every position the variant's top token is compared with
FP32's (next-token agreement) and the real next token's probability gives the perplexity. The budget is the
perplexity's rise relative to FP32's (e.g. 0.03 for +3 %).
"""

from __future__ import annotations

import math
from importlib import resources

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.engine.decoder.stepper import DecoderStepper

REFERENCE_TEXT_SOURCE = "Python Language Reference excerpts (CPython 3.11.7 pydoc_data.topics, PSF License 2.0)"


def reference_text() -> str:
    return resources.files("metainfer.core.engine.decoder").joinpath("reference_text.txt").read_text("utf-8")


class TeacherForced(BaseModel):
    """Per-position results of one model over the text's windows."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    top_tokens: list[int]
    nll: list[float]

    @property
    def perplexity(self) -> float:
        return math.exp(sum(self.nll) / len(self.nll)) if self.nll else float("nan")


class DecoderQuality(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens: int = Field(description="positions scored")
    next_token_agreement: float = Field(ge=0, le=1)
    perplexity: float
    reference_perplexity: float
    text: str = REFERENCE_TEXT_SOURCE

    @property
    def perplexity_rise(self) -> float:
        """Relative rise over FP32's perplexity (0.03 = +3 %)."""
        return self.perplexity / self.reference_perplexity - 1.0

    def describe(self) -> str:
        return (f"perplexity {self.perplexity:.3f} vs FP32 {self.reference_perplexity:.3f} "
                f"({self.perplexity_rise:+.2%}), next-token agreement {self.next_token_agreement:.1%} over "
                f"{self.tokens} tokens")  # fmt: skip


def windows(token_ids: list[int], window: int, max_tokens: int) -> list[list[int]]:
    """Consecutive windows of ``window`` tokens covering at most ``max_tokens`` of the text."""
    ids = token_ids[:max_tokens]
    return [ids[start : start + window] for start in range(0, len(ids) - 1, window) if len(ids[start:]) > 1]


def teacher_forced(stepper: DecoderStepper, token_windows: list[list[int]]) -> TeacherForced:
    top: list[int] = []
    nll: list[float] = []
    for tokens in token_windows:
        logits, _ = stepper.all_logits(tokens, stepper.empty_cache())
        logits = logits.astype(np.float64)
        log_probs = logits - logits.max(axis=-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(axis=-1, keepdims=True))
        top.extend(int(t) for t in np.argmax(logits[:-1], axis=-1))
        nll.extend(float(-log_probs[i, tokens[i + 1]]) for i in range(len(tokens) - 1))
    return TeacherForced(top_tokens=top, nll=nll)


def compare(variant: TeacherForced, reference: TeacherForced) -> DecoderQuality:
    if len(variant.top_tokens) != len(reference.top_tokens) or not reference.top_tokens:
        raise ValueError("the variant and the reference were not scored on the same text")
    agreement = float(np.mean(np.array(variant.top_tokens) == np.array(reference.top_tokens)))
    return DecoderQuality(tokens=len(reference.top_tokens), next_token_agreement=agreement,
                          perplexity=variant.perplexity, reference_perplexity=reference.perplexity)  # fmt: skip
