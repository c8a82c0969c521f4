"""Choosing the next token from logits: greedy at temperature 0, else seeded temperature and nucleus (top-p)
sampling, as OpenAI's completions API defines them. One ``numpy`` generator per request, seeded from the
request's ``seed``: the same request with the same seed gives the same tokens, whatever else is batched with it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be between 0 and 2, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be greater than 0 and at most 1, got {self.top_p}")


def next_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """The next token from one position's logits ``[vocab]``."""
    if params.temperature == 0.0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / params.temperature
    scaled -= scaled.max()
    probabilities = np.exp(scaled)
    probabilities /= probabilities.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probabilities, kind="stable")
        cumulative = np.cumsum(probabilities[order])
        keep = order[: int(np.searchsorted(cumulative, params.top_p)) + 1]
        nucleus = np.zeros_like(probabilities)
        nucleus[keep] = probabilities[keep]
        probabilities = nucleus / nucleus.sum()
    return int(rng.choice(probabilities.size, p=probabilities))
