"""FP32's outputs as the yardstick of every variant, and how a variant's outputs are compared with them.

``make_reference`` runs FP32 once per adaptation on the quality samples, run after run at the production batch,
with the samples first (``batch_major``), and records which outputs a sample owns (``rows_per_sample``: the
detections non-max suppression kept are the run's, not a sample's) and how far FP32 itself moves between a sample
alone and in a run (``refuse_batch_mixing``). ``quality_of`` reads a variant's outputs in the metric the budget is
written in: top-1 from class ids or scores, per-step argmax agreement, a platform's plugin, or cosine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from metainfer.core.engine import quality_metrics
from metainfer.core.engine.data import Dataset
from metainfer.core.engine.errors import ModelError
from metainfer.core.engine.quality_choice import PLUGIN_PREFIX
from metainfer.core.engine.reference_refusals import refuse_labels_no_class_has, refuse_nan_answers
from metainfer.core.engine.runtime import Session
from metainfer.core.engine.trial import Quality, QualityMetric


@dataclass(frozen=True)
class Reference:
    """FP32 outputs on the quality samples, and the FP32 top-1 accuracy if labels exist.

    ``token_mask`` is the model's attention mask ([samples, sequence]) when it has
    one: sequence outputs are then compared as mask-weighted mean-pooled vectors,
    which is what a sentence-embedding model serves, instead of including the
    hidden states of padding tokens, which no consumer reads.

    Outputs that no sample owns (a detector's selected boxes after non-max
    suppression: as many rows as the run kept, whatever its samples) change with
    how samples are grouped into runs and with every rounding that moves a score
    across the threshold; compared row by row they would compare different
    boxes. They are left out of the comparison (``per_sample``), and a model
    with no other output needs a quality plugin.
    """

    outputs: list[np.ndarray]
    labels: np.ndarray | None
    accuracy: float | None
    token_mask: np.ndarray | None = None
    # The metric the quality budget is written in (quality_metrics.resolve); "auto": top-1 with labels, else cosine.
    metric: str = "auto"
    # The samples the outputs are of. run_all puts them first; an output with no samples' axis (a per-run
    # summary, concatenated run after run) is cut by its share of rows. None: one row per sample.
    samples: int | None = None
    # Per output, whether it has a fixed number of rows per sample in every run (``rows_per_sample``): only those
    # are compared sample by sample. None: all of them.
    per_sample: tuple[bool, ...] | None = None
    names: tuple[str, ...] = ()
    # FP32's own quality drop between its samples alone and in runs of the reference's batch (_shared_run_drop).
    shared_run_drop: float | None = None

    def compared(self) -> list[int]:
        """The indices of the outputs that quality and batch dependence compare with FP32's, sample by sample."""
        return [i for i in range(len(self.outputs)) if self.per_sample is None or self.per_sample[i]]

    def label_output(self) -> int | None:
        """The index of the output top-1 accuracy reads (quality_metrics.label_output), among the compared ones."""
        compared = self.compared()
        found = quality_metrics.label_output([self.outputs[i] for i in compared])
        return None if found is None else compared[found]

    def left_out(self) -> list[str]:
        """The names of the outputs that are not compared: a variable or fixed number of rows per run (selected
        detections after non-max suppression, a constant), which no sample owns."""
        kept = set(self.compared())
        return [self.names[i] if i < len(self.names) else f"#{i}" for i in range(len(self.outputs)) if i not in kept]

    def head(self, n: int) -> Reference:
        return self.part(0, n)

    def part(self, start: int, stop: int) -> Reference:
        """The reference of samples ``start`` to ``stop``."""
        labels = None if self.labels is None else self.labels[start:stop]
        outputs = [o[self._rows(o, start) : self._rows(o, stop)] for o in self.outputs]
        scores = self.label_output()
        accuracy = None if labels is None or scores is None else top1_accuracy(outputs[scores], labels)
        mask = None if self.token_mask is None else self.token_mask[start:stop]
        n = len(range(*slice(start, stop).indices(self.samples or len(self.outputs[0]))))
        samples = None if self.samples is None else n
        return dataclasses.replace(
            self, outputs=outputs, labels=labels, accuracy=accuracy, token_mask=mask, samples=samples
        )

    def _rows(self, output: np.ndarray, n: int) -> int:
        if not self.samples or output.shape[0] == self.samples:
            return n
        return int(output.shape[0]) * n // self.samples


Runs = list[tuple[int, list[np.ndarray]]]


def run_all(session: Session, data: Dataset, batch: int) -> list[np.ndarray]:
    """Outputs for every sample, computed ``batch`` samples at a time, samples first (``batch_major``)."""
    return _concatenate(session, _runs(session, data, batch))


def _runs(session: Session, data: Dataset, batch: int) -> Runs:
    """Each run's number of samples and outputs."""
    return [(rows.stop - rows.start, session.run(None, feed)) for feed, rows in data.batches(batch)]


def _concatenate(session: Session, runs: Runs) -> list[np.ndarray]:
    """The runs' outputs run after run, samples first.

    One run's shapes can leave the samples' axis in doubt (a seq-major output with as many steps as the run has
    samples); another run's (the last, smaller one) settle it, and every run's output is then read the same way."""
    outputs = []
    for i in range(len(runs[0][1])):
        axes = [samples_axis(out[i], rows) for rows, out in runs]
        # A scalar per run of several samples (a mean over the run) changes with the batch: no sample's value can
        # be compared, and the runs' scalars cannot even be concatenated.
        per_run = next((rows for rows, out in runs if out[i].ndim == 0 and rows > 1), None)
        if per_run is not None:
            name = session.get_outputs()[i].name
            raise ModelError(
                f"output {name[:100]!r}",
                f"a run of {per_run} samples gives it as one scalar: it is one value per run, not per sample, so it "
                "changes with the batch and cannot be checked sample by sample. Export the model without it, or with "
                "the batch fixed at 1",
            )
        settled = next((a for a in axes if a not in (None, 0)), 0)
        axis = settled if all(a in (settled, 0) for a in axes) else 0
        # Runs of one sample: a scalar output is that sample's value (atleast_1d gives it its entry).
        outputs.append(np.concatenate([np.atleast_1d(batch_major(out[i], rows, axis)) for rows, out in runs]))
    return outputs


def rows_per_sample(runs: Runs) -> list[int | None]:
    """Per output, the rows it has for each sample when every run gives the same whole number of rows per sample
    (1, or the steps of a [samples * steps, classes] output), None when runs give it rows of their own (a
    constant, the detections non-max suppression kept)."""
    per_output: list[int | None] = []
    for i in range(len(runs[0][1])):
        ratios = set()
        for rows, out in runs:
            length = int(np.atleast_1d(batch_major(out[i], rows)).shape[0])
            ratios.add(length // rows if length % rows == 0 else 0)
        ratio = ratios.pop() if len(ratios) == 1 else 0
        per_output.append(ratio or None)
    return per_output


def samples_axis(output: np.ndarray, rows: int) -> int | None:
    """The axis of a run's ``output`` that holds its ``rows`` samples: the first whose length is ``rows`` (0
    whenever it is, though a later one may be too), None when there is none (an output per run, not per sample)."""
    return next((axis for axis, length in enumerate(output.shape) if length == rows), None)


def batch_major(output: np.ndarray, rows: int, axis: int | None = None) -> np.ndarray:
    """``output`` of a run of ``rows`` samples with the samples on its first axis.

    Exporters do not all put them there: PyTorch's seq-major recognisers return [steps, batch, classes]. Their
    batches concatenated along the first axis interleave samples and steps, so a batch of 1 and a batch of 8 give
    outputs of different layouts, and per-sample metrics (argmax agreement over steps, worst sample of a grouping)
    read steps as samples. ``axis``: where the samples are, if known; else ``samples_axis``. An output with no
    such axis is returned as it is."""
    if axis is None:
        axis = samples_axis(output, rows)
    if not axis or output.ndim <= axis or output.shape[axis] != rows:
        return output
    return np.moveaxis(output, axis, 0)


def make_reference(session: Session, data: Dataset, batch: int, metric: str = "auto") -> Reference:
    """FP32's outputs on ``data`` and the metric ``metric`` means for them (raises DataError if it cannot be had,
    ModelError if no output is one a sample owns and no plugin metric reads them)."""
    runs = _runs(session, data, batch)
    outputs = _concatenate(session, runs)
    declared = session.get_outputs()
    # An output of fixed shape cannot follow a batch the inputs leave open, even where a run's rows match it.
    batch_open = any(i.shape and not isinstance(i.shape[0], int) for i in session.get_inputs())
    fixed = [batch_open and bool(o.shape) and all(isinstance(d, int) for d in o.shape) for o in declared]
    per_sample = tuple(k is not None and not f for k, f in zip(rows_per_sample(runs), fixed, strict=True))
    names = tuple(o.name for o in declared)
    if not any(per_sample) and not metric.startswith(PLUGIN_PREFIX):
        first = runs[0][1]
        shapes = {name[:60]: list(first[i].shape) for i, name in enumerate(names[:8])}
        raise ModelError(
            "model outputs",
            f"none has a fixed number of rows per sample (in runs of {runs[0][0]} samples: {shapes}); metainfer "
            "compares a variant with FP32 sample by sample. Export the model with per-sample outputs as well (for "
            "a detector, the boxes and scores before non-max suppression, or padded to a fixed count per image), or"
            " name a quality plugin (slo.qualityMetric plugin:NAME) that compares such outputs",
        )
    compared = [o for o, kept in zip(outputs, per_sample, strict=True) if kept]
    refuse_nan_answers([(n, o) for n, o, kept in zip(names, outputs, per_sample, strict=True) if kept], data)
    resolved = quality_metrics.resolve(metric, compared or outputs, data.labels, data.n_samples)
    reference = Reference(outputs, data.labels, None, token_mask(data), resolved, data.n_samples, per_sample, names)
    scores = reference.label_output()
    if data.labels is not None and scores is not None:
        if resolved == "top1_accuracy":  # labels another metric does not read cannot mislead it
            refuse_labels_no_class_has(outputs[scores], names[scores], data.labels)
        reference = dataclasses.replace(reference, accuracy=top1_accuracy(outputs[scores], data.labels))
    if batch_open:
        reference = dataclasses.replace(reference, shared_run_drop=_shared_run_drop(session, data, batch, reference))
    return reference


def _shared_run_drop(session: Session, data: Dataset, batch: int, reference: Reference) -> float | None:
    """How far FP32's own quality drops when its first samples run alone instead of in runs of ``batch``, in the
    reference's metric: about 0 for a model whose samples do not see each other (FP32 kernels differ by batch only
    in the last bits; a user's own dynamic int8 export by its per-run scales), large for one that computes across
    its batch (batch statistics, a branch on the whole input). None where it cannot be had here."""
    if batch <= 1 or reference.metric.startswith(PLUGIN_PREFIX):
        return None
    head = data.head(min(data.n_samples, 2 * batch))
    try:
        alone = run_all(session, head, 1)
    except ModelError:
        raise
    except Exception:  # a model that cannot run one sample fails where that matters: validation at batch 1
        return None
    return quality_of(alone, reference.head(head.n_samples)).drop


def refuse_batch_mixing(reference: Reference, batch: int, budget: float) -> None:
    """Raises ModelError when FP32 itself loses more than the quality ``budget`` between its samples alone and in
    runs of ``batch``: no variant can be validated against it, and a serving pod that puts concurrent requests in
    one run would change each client's answer by more than the policy allows."""
    drop = reference.shared_run_drop
    if drop is None or drop <= budget:
        return
    raise ModelError(
        "model",
        f"the FP32 model's {reference.metric} drops by {drop:.4g} (budget {budget:g}) between running its samples "
        f"alone and in runs of {batch}: it computes across its batch (BatchNormalization or Dropout in training "
        "mode, a statistic or branch over the whole input, random ops), so a sample's answer depends on what shares "
        "its run. Export it in inference mode (torch: model.eval() before exporting), or adapt it at --batch 1 "
        "(policy: slo.batchSize: 1)",
    )


def token_mask(data: Dataset) -> np.ndarray | None:
    """The attention mask input ([samples, sequence] of 0/1), if the model takes one."""
    for name, arr in data.inputs.items():
        if "mask" in name.lower() and arr.ndim == 2 and arr.dtype.kind in "iub":
            return arr
    return None


def mean_pooled(output: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[..., None].astype(np.float64)
    pooled: np.ndarray = (output.astype(np.float64) * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
    return pooled


def predicted_classes(scores: np.ndarray, n: int) -> np.ndarray:
    """Each of ``n`` samples' predicted class: ``scores`` are class ids (one integer per sample), or scores over
    classes (their argmax)."""
    if np.issubdtype(scores.dtype, np.integer) and scores.size == n:
        return scores.reshape(-1)
    predicted: np.ndarray = np.argmax(scores.reshape(n, -1), axis=1)
    return predicted


def top1_accuracy(scores: np.ndarray, labels: np.ndarray) -> float:
    """The share of samples whose predicted class is the label."""
    return float(np.mean(predicted_classes(scores, len(labels)) == labels))


def mean_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Mean per-sample cosine similarity of two float outputs (flattened past the first axis).

    A sample that is zero in both counts as equal (1), zero in one only as unrelated (0): a variant answering
    zeros once scored a perfect 1 (the product of the norms was 0 either way). Infinities where FP32 has the same
    one (log-probabilities of masked classes) are left out of the sample's vectors; elsewhere they make it -1."""
    a2 = a.reshape(a.shape[0], -1).astype(np.float64)
    b2 = b.reshape(b.shape[0], -1).astype(np.float64)
    same_inf = np.isinf(b2) & (a2 == b2)
    a2, b2 = np.where(same_inf, 0.0, a2), np.where(same_inf, 0.0, b2)
    with np.errstate(invalid="ignore", over="ignore"):
        num = np.sum(a2 * b2, axis=1)
        norm_a, norm_b = np.linalg.norm(a2, axis=1), np.linalg.norm(b2, axis=1)
        den = norm_a * norm_b
        cos = np.where(den == 0, np.where((norm_a == 0) & (norm_b == 0), 1.0, 0.0), num / np.where(den == 0, 1.0, den))
    return float(np.mean(np.nan_to_num(cos, nan=-1.0, posinf=-1.0, neginf=-1.0)))


def quality_of(outputs: list[np.ndarray], ref: Reference) -> Quality:
    n = ref.samples or ref.outputs[0].shape[0]
    metric = ref.metric
    if metric.startswith(PLUGIN_PREFIX):  # a plugin reads every output, those no sample owns included
        name = metric.removeprefix(PLUGIN_PREFIX)
        value = quality_metrics.user_value(name, outputs, ref.outputs)
        own = quality_metrics.user_value(name, ref.outputs, ref.outputs)
        return Quality(metric="user_metric", value=value, reference=own, drop=own - value, samples=n, name=name)
    compared = ref.compared()
    _same_rows(outputs, ref, compared)
    scores = ref.label_output()
    if metric == "auto":
        metric = "top1_accuracy" if ref.labels is not None and ref.accuracy is not None else "cosine_similarity"
    if metric == "top1_accuracy" and ref.labels is not None and ref.accuracy is not None and scores is not None:
        value = top1_accuracy(outputs[scores], ref.labels)
        return Quality(
            metric="top1_accuracy", value=value, reference=ref.accuracy, drop=ref.accuracy - value, samples=n
        )
    outputs = [outputs[i] for i in compared]
    references = [ref.outputs[i] for i in compared]
    if metric == "argmax_agreement":
        value = quality_metrics.argmax_agreement(outputs, references, ref.token_mask)
        return Quality(metric="argmax_agreement", value=value, reference=1.0, drop=1.0 - value, samples=n)
    floats = [i for i, o in enumerate(references) if np.issubdtype(o.dtype, np.floating)]
    if not floats:  # integer-only outputs (class ids): agreement rate
        value = float(np.mean([np.mean(outputs[i] == references[i]) for i in range(len(references))]))
        return Quality(metric="cosine_similarity", value=value, reference=1.0, drop=1.0 - value, samples=n)
    mask = ref.token_mask
    pooled = [
        i for i in floats if mask is not None and references[i].ndim == 3 and references[i].shape[:2] == mask.shape
    ]
    if metric == "relative_l2_similarity":
        value = float(np.mean([quality_metrics.relative_l2_similarity(outputs[i], references[i]) for i in floats]))
        return Quality(metric="relative_l2_similarity", value=value, reference=1.0, drop=1.0 - value, samples=n)
    values = []
    for i in floats:
        if quality_metrics.one_value_per_sample(references[i], n):  # a cosine of one number is only its sign
            values.append(quality_metrics.relative_l2_similarity(outputs[i], references[i]))
        elif i in pooled:
            assert mask is not None  # narrows the type: ``pooled`` is empty without a mask
            values.append(mean_cosine(mean_pooled(outputs[i], mask), mean_pooled(references[i], mask)))
        else:
            values.append(mean_cosine(outputs[i], references[i]))
    value = float(np.mean(values))
    cosine: QualityMetric = "mean_pooled_cosine_similarity" if pooled else "cosine_similarity"
    return Quality(metric=cosine, value=value, reference=1.0, drop=1.0 - value, samples=n)


def _same_rows(outputs: list[np.ndarray], ref: Reference, compared: list[int]) -> None:
    """Raises ModelError for a compared output whose rows here are not FP32's on the same samples: its rows per
    sample were fixed in runs of the reference's batch, and another batch (or variant) changed them."""
    for i in compared:
        if outputs[i].shape[:1] != ref.outputs[i].shape[:1]:
            name = ref.names[i] if i < len(ref.names) else f"#{i}"
            raise ModelError(
                f"output {name[:100]!r}",
                f"{outputs[i].shape[0] if outputs[i].ndim else 0} rows here, {ref.outputs[i].shape[0]} for FP32 on "
                "the same samples: its rows per sample change with the batch, so it cannot be compared sample by "
                "sample. Export it with one row per sample, or with the batch fixed",
            )
