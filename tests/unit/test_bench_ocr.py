"""The OCR matrix's task measures: CTC greedy decoding and the text-map IoU (bench/ocr_models.py)."""

from __future__ import annotations

import numpy as np

from bench.ocr_models import DB_THRESHOLD, ctc_read, map_iou


def _scores(steps: list[list[int]], classes: int = 5) -> np.ndarray:
    out = np.zeros((len(steps), len(steps[0]), classes), dtype=np.float32)
    for i, row in enumerate(steps):
        out[i, np.arange(len(row)), row] = 1.0
    return out


def test_ctc_read_collapses_repeats_drops_blanks_and_keeps_a_letter_repeated_across_a_blank() -> None:
    alphabet = ["", "a", "b", "c", " "]
    scores = _scores([[1, 1, 0, 1, 2, 2, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0], [3, 4, 4, 1, 0, 3, 3, 3]])
    assert ctc_read(scores, alphabet) == ["aab", "", "c ac"]


def test_map_iou_is_one_for_equal_maps_and_for_two_empty_maps_and_falls_with_disagreement() -> None:
    reference = np.zeros((2, 1, 4, 4), dtype=np.float32)
    reference[0, 0, :2, :] = 0.9  # 8 text pixels on the first page, none on the second
    assert map_iou(reference, reference.copy()) == 1.0
    shifted = np.zeros_like(reference)
    shifted[0, 0, 1:3, :] = 0.9  # 4 of 12 pixels in both
    assert map_iou(reference, shifted) == (4 / 12 + 1.0) / 2
    below = reference * (DB_THRESHOLD / 0.9) * 0.99  # under the threshold: no text at all on the first page
    assert map_iou(reference, below) == 0.5
