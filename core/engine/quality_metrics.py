"""Which metric a policy's quality budget is written in, and the metrics beyond top-1 and cosine.

Cosine similarity says little about a sequence classifier: a CTC text recogniser whose per-step scores keep a
cosine of 0.95 can still read one line in ten differently. For such outputs the meaningful measure is whether each
step's argmax (the character, the tag) is still the one FP32 picks, and a sample counts as kept only when all its
steps are: "lines read as FP32 reads them". ``auto`` chooses it from the outputs' shape and values (a
distribution over classes at every step); a policy can ask for it (token-tagging logits, which are not
normalised), or for a metric of its own, registered by the platform team as a Python entry point in the group
``metainfer.quality_metrics`` of the image: a policy names it, it cannot import arbitrary code.
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
from collections.abc import Callable, Sequence

import numpy as np

from metainfer.core.engine.errors import DataError
from metainfer.core.engine.quality_choice import BUILTIN, ENTRY_POINT_GROUP, PLUGIN_PREFIX

UserMetric = Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], float]
_DISTRIBUTION_TOLERANCE = 1e-3
FIELD = "slo.qualityMetric"
# Metrics whose value is a share of samples (classified right, or read as FP32 reads them): they move in whole
# samples, so a budget finer than one sample's share allows no change at all.
SAMPLE_COUNTING = ("top1_accuracy", "argmax_agreement")
# The budget a coarse-budget note suggests is rounded up to this many decimals (a budget rounded down would still
# reject one sample's change).
_SUGGESTED_DECIMALS = 4


def resolve(choice: str, outputs: Sequence[np.ndarray], labels: np.ndarray | None, samples: int) -> str:
    """The metric ``choice`` means for a model with these FP32 ``outputs`` of ``samples`` samples; raises DataError
    naming the field when it cannot be computed for them."""
    if choice == "auto":
        if labels is not None and label_output(outputs) is not None:
            return "top1_accuracy"
        if any(is_per_step_distribution(o) for o in outputs):
            return "argmax_agreement"
        floats = [o for o in outputs if np.issubdtype(o.dtype, np.floating)]
        # A regression's value or a binary classifier's probability: a cosine of one number is only its sign.
        if floats and all(one_value_per_sample(o, samples) for o in floats):
            return "relative_l2_similarity"
        return "cosine_similarity"
    if choice == "top1_accuracy" and labels is None:
        raise DataError(FIELD, "top1_accuracy needs labels: add a 'labels' array to the data NPZ, or choose another")
    if choice == "top1_accuracy" and label_output(outputs) is None:
        kinds = [f"{o.dtype}{list(o.shape)}" for o in outputs[:8]]
        raise DataError(
            FIELD,
            f"top1_accuracy needs an output of class scores [samples, classes] or of predicted class ids (one integer"
            f" per sample); got {kinds} (one float per sample is a binary score whose threshold is unknown: export"
            " both classes' scores, or choose cosine_similarity)",
        )
    if choice == "relative_l2_similarity" and not any(np.issubdtype(o.dtype, np.floating) for o in outputs):
        kinds = [f"{o.dtype}{list(o.shape)}" for o in outputs[:8]]
        raise DataError(FIELD, f"relative_l2_similarity compares float outputs; got {kinds}")
    if choice == "argmax_agreement" and not class_scores(outputs):
        shapes = [list(o.shape) for o in outputs]
        raise DataError(FIELD, f"argmax_agreement needs a float output with classes on its last axis; got {shapes}")
    if choice.startswith(PLUGIN_PREFIX):
        user_metric(choice.removeprefix(PLUGIN_PREFIX))  # a missing plugin fails here, before any trial
    elif choice not in BUILTIN:
        raise DataError(FIELD, f"unknown metric {choice[:80]!r}: expected auto, {', '.join(BUILTIN)} or plugin:<name>")
    return choice


def label_output(outputs: Sequence[np.ndarray]) -> int | None:
    """The index of the output top-1 accuracy reads: the first one of predicted class ids (one integer per sample,
    as skl2onnx's ``label`` or an exported argmax), else the first of float scores with the classes on the last
    axis; None when there is neither."""
    for i, output in enumerate(outputs):
        if np.issubdtype(output.dtype, np.integer) and output.ndim >= 1 and output.size == output.shape[0]:
            return i
    return next(
        (i for i, o in enumerate(outputs) if np.issubdtype(o.dtype, np.floating) and o.ndim >= 2 and o.shape[-1] > 1),
        None,
    )


def one_value_per_sample(output: np.ndarray, samples: int) -> bool:
    """Whether ``output`` holds a single number for each of ``samples`` samples ([samples], [samples, 1], ...)."""
    return output.size == samples


def relative_l2_similarity(output: np.ndarray, reference: np.ndarray) -> float:
    """1 - ||output - reference|| / ||reference|| over every sample: 1 when equal, 0.95 for a 5% error, at least
    -1. Unlike a per-sample cosine it sees a scale or an offset (a probability of 0.99 for every sample).
    Infinities equal to FP32's are left out, as in the cosine."""
    a, b = output.astype(np.float64).ravel(), reference.astype(np.float64).ravel()
    kept = ~(np.isinf(b) & (a == b))
    a, b = a[kept], b[kept]
    with np.errstate(invalid="ignore", over="ignore"):
        scale = float(np.linalg.norm(b))
        error = float(np.linalg.norm(a - b))
    if not np.isfinite(error):
        return -1.0
    if scale == 0.0:
        return 1.0 if error == 0.0 else -1.0
    return max(-1.0, 1.0 - error / scale)


def is_per_step_distribution(output: np.ndarray) -> bool:
    """[samples, steps, classes] float scores that are probabilities or log-probabilities at every step: the
    head of a sequence classifier (CTC recogniser, tagger with softmax), not hidden states or boxes."""
    if output.ndim != 3 or output.shape[1] < 2 or output.shape[2] < 2 or not np.issubdtype(output.dtype, np.floating):
        return False
    scores = output.astype(np.float64)
    if not np.all(np.isfinite(scores)):
        return False
    if scores.min() >= -_DISTRIBUTION_TOLERANCE:
        return bool(np.allclose(scores.sum(axis=-1), 1.0, atol=_DISTRIBUTION_TOLERANCE * scores.shape[-1]))
    if scores.max() <= _DISTRIBUTION_TOLERANCE:
        peak = scores.max(axis=-1, keepdims=True)
        logsumexp = peak[..., 0] + np.log(np.exp(scores - peak).sum(axis=-1))
        return bool(np.allclose(logsumexp, 0.0, atol=_DISTRIBUTION_TOLERANCE * scores.shape[-1]))
    return False


def class_scores(outputs: Sequence[np.ndarray]) -> list[int]:
    """Indices of the outputs argmax agreement compares: float, per-sample scores over classes on the last axis."""
    return [i for i, o in enumerate(outputs) if np.issubdtype(o.dtype, np.floating) and o.ndim >= 2 and o.shape[-1] > 1]


def argmax_agreement(
    outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray], mask: np.ndarray | None = None
) -> float:
    """The fraction of samples whose argmax over classes equals FP32's at every step (positions a [samples,
    steps] attention mask marks as padding are not compared), averaged over the class-score outputs."""
    values = []
    for i in class_scores(reference):
        same = np.argmax(outputs[i], axis=-1) == np.argmax(reference[i], axis=-1)  # [samples, *steps]
        if mask is not None and same.ndim == 2 and same.shape == mask.shape:
            same = same | (mask == 0)
        values.append(float(np.mean(same.reshape(same.shape[0], -1).all(axis=1))))
    return float(np.mean(values))


def quality_step(metric: str, samples: int, outputs: int = 1) -> float | None:
    """The smallest change ``metric`` can show on ``samples`` samples: one sample's share (in one of ``outputs``
    outputs, for a metric averaged over several); None for a metric that moves continuously (cosine, L2, a
    plugin, whose granularity is unknown)."""
    if metric not in SAMPLE_COUNTING or samples < 1:
        return None
    return 1.0 / (samples * max(outputs, 1))


def coarse_budget_note(metric: str, samples: int, budget: float, outputs: int = 1) -> str | None:
    """What to tell a person whose quality budget is finer than ``metric``'s step over ``samples`` samples (the
    argmax agreement of 64 samples moves by 1/64 = 0.0156, so a budget of 0.01 lets no sample change): None when
    the budget allows at least one sample's change, or is zero (no change was asked for)."""
    step = quality_step(metric, samples, outputs)
    # The same hair of tolerance the quality constraint has (scoring.violations).
    if step is None or budget <= 0 or budget + 1e-9 >= step:
        return None
    scale = 10**_SUGGESTED_DECIMALS
    suggested = math.ceil(step * scale - 1e-6) / scale
    over = f"{samples} samples" + (f" and {outputs} outputs" if outputs > 1 else "")
    return (
        f"quality budget {budget:g} is finer than {metric}'s step over {over} ({step:.4f}: one sample counted"
        " differently): only variants that change no sample's result pass; measure quality on more samples, or"
        f" allow a drop of at least {suggested:g}"
    )


def user_value(name: str, outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> float:
    """The plugin's value for ``outputs`` (higher is better); a plugin that fails or returns no finite number
    fails the run with its name, not a silent quality of zero."""
    metric = user_metric(name)
    try:
        value = float(metric(list(outputs), list(reference)))
    except Exception as exc:  # the plugin is the platform's code: any failure is reported as its own
        raise DataError(FIELD, f"quality metric plugin {name!r} raised {type(exc).__name__}: {str(exc)[:300]}") from exc
    if not np.isfinite(value):
        raise DataError(FIELD, f"quality metric plugin {name!r} returned {value}, not a finite number")
    return value


@functools.cache
def user_metric(name: str) -> UserMetric:
    """The entry point ``name`` in the group ``metainfer.quality_metrics``; raises DataError listing those there."""
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    matches = [ep for ep in found if ep.name == name]
    if not matches:
        offered = ", ".join(sorted(ep.name for ep in found)) or "none"
        raise DataError(
            FIELD,
            f"no quality metric plugin {name[:64]!r} in this image (entry point group {ENTRY_POINT_GROUP};"
            f" installed: {offered})",
        )
    try:
        loaded = matches[0].load()
    except Exception as exc:  # an import error inside the plugin's package
        raise DataError(FIELD, f"quality metric plugin {name!r} failed to load: {type(exc).__name__}: {exc}") from exc
    if not callable(loaded):
        raise DataError(FIELD, f"quality metric plugin {name!r} is not callable")
    metric: UserMetric = loaded
    return metric
