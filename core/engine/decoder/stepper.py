"""Prefill and decode steps of a decoder over any ``Session``, with sequences of different lengths in one step.

Each sequence keeps its own cache (per layer, key and value ``[kv_heads, length, head_dim]``). A step lays the
batch out on one grid of slots: every sequence's past right-aligned in ``max_past`` slots, then its new tokens
right-aligned in ``max_new`` slots; the mask is 1 on real slots only and ``position_ids`` count each sequence's
own tokens, so the padding changes nothing a sequence sees (a unit test holds a batched step to the same
sequence stepped alone). The present cache a step gives back is split again by the mask.

ONNX Runtime GenAI's GroupQueryAttention derives positions and lengths from the mask as if it were contiguous;
sequences of that form are stepped one at a time (``batches_ragged`` False).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metainfer.core.engine.decoder.signature import DecoderSignature
from metainfer.core.engine.runtime import Session


@dataclass
class SequenceCache:
    keys: list[np.ndarray]
    values: list[np.ndarray]

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[1]) if self.keys else 0

    @property
    def nbytes(self) -> int:
        return sum(int(array.nbytes) for array in (*self.keys, *self.values))


class DecoderStepper:
    def __init__(self, session: Session, signature: DecoderSignature) -> None:
        self.session = session
        self.signature = signature
        self.batches_ragged = signature.form != "group_query_attention"
        self._cache_dtype = np.dtype(signature.cache_dtype)
        self._ids_dtype = np.dtype(signature.ids_dtype)
        self._mask_dtype = np.dtype(signature.mask_dtype)
        self._outputs = [signature.logits] + [name for layer in signature.layers
                                              for name in (layer.present_key, layer.present_value)]  # fmt: skip

    def empty_cache(self) -> SequenceCache:
        shape = (self.signature.kv_heads, 0, self.signature.head_dim)
        empty = [np.zeros(shape, self._cache_dtype) for _ in self.signature.layers]
        return SequenceCache(empty, [array.copy() for array in empty])

    def step(
        self, new_tokens: Sequence[Sequence[int]], caches: Sequence[SequenceCache]
    ) -> tuple[np.ndarray, list[SequenceCache]]:
        """Run every sequence's new tokens after its cache: the logits at each sequence's last new token
        ``[sequences, vocab]`` (float32) and the grown caches. ``all_logits`` gives every position's."""
        if self.batches_ragged or len(new_tokens) == 1:
            logits, grown = self._step(new_tokens, caches, last_only=True)
            return logits[:, 0, :], grown
        outs = [self._step([tokens], [cache], last_only=True) for tokens, cache in zip(new_tokens, caches, strict=True)]
        return np.concatenate([logits[:, 0, :] for logits, _ in outs]), [grown[0] for _, grown in outs]

    def all_logits(self, tokens: Sequence[int], cache: SequenceCache) -> tuple[np.ndarray, SequenceCache]:
        """One sequence's logits at every new position ``[len(tokens), vocab]`` (teacher forcing)."""
        logits, grown = self._step([tokens], [cache], last_only=False)
        return logits[0], grown[0]

    def _step(
        self, new_tokens: Sequence[Sequence[int]], caches: Sequence[SequenceCache], *, last_only: bool
    ) -> tuple[np.ndarray, list[SequenceCache]]:
        if len(new_tokens) != len(caches) or not new_tokens or any(not tokens for tokens in new_tokens):
            raise ValueError("a step needs one non-empty token list per cache")
        batch = len(new_tokens)
        max_past = max(cache.length for cache in caches)
        max_new = max(len(tokens) for tokens in new_tokens)
        ids = np.zeros((batch, max_new), self._ids_dtype)
        positions = np.zeros((batch, max_new), self._ids_dtype)
        mask = np.zeros((batch, max_past + max_new), self._mask_dtype)
        for row, (tokens, cache) in enumerate(zip(new_tokens, caches, strict=True)):
            count, past = len(tokens), cache.length
            ids[row, max_new - count :] = tokens
            positions[row, max_new - count :] = np.arange(past, past + count)
            mask[row, max_past - past : max_past] = 1
            mask[row, max_past + max_new - count :] = 1
        feed: dict[str, np.ndarray] = {self.signature.input_ids: ids, self.signature.attention_mask: mask}
        if self.signature.position_ids is not None:
            feed[self.signature.position_ids] = positions
        shape = (batch, self.signature.kv_heads, max_past, self.signature.head_dim)
        for index, layer in enumerate(self.signature.layers):
            for name, arrays in ((layer.past_key, [c.keys[index] for c in caches]),
                                 (layer.past_value, [c.values[index] for c in caches])):  # fmt: skip
                padded = np.zeros(shape, self._cache_dtype)
                for row, array in enumerate(arrays):
                    if array.shape[1]:
                        padded[row, :, max_past - array.shape[1] :, :] = array
                feed[name] = padded
        results = self.session.run(self._outputs, feed)
        logits = np.asarray(results[0], dtype=np.float32)
        logits = logits[:, -1:, :] if last_only else logits[:, max_new - len(new_tokens[0]) :, :]
        grown: list[SequenceCache] = []
        for row in range(batch):
            real = np.flatnonzero(mask[row])
            keys = [
                np.ascontiguousarray(results[1 + 2 * i][row][:, real, :]) for i in range(len(self.signature.layers))
            ]
            values = [np.ascontiguousarray(results[2 + 2 * i][row][:, real, :])
                      for i in range(len(self.signature.layers))]  # fmt: skip
            grown.append(SequenceCache(keys, values))
        return logits, grown
