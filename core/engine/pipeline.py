"""The local adaptation pipeline: baseline, search, validate, report.

This is the whole co-adaptation loop for one model on one machine, used as is
by ``metainfer adapt`` and by the agent Job. It is pure apart from running
ONNX Runtime: no Kubernetes, no printing. Progress goes to an ``Observer`` so
the CLI can draw bars and the agent can patch run status; every latency and
quality figure the decisions rest on comes from a ``Measurer`` (by default
ONNX Runtime in this process), so the decisions can be tested on their own.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import onnx

from metainfer.core.engine import quality_metrics, runoff, scan_gate
from metainfer.core.engine.anchors import anchor_points
from metainfer.core.engine.candidates import SpaceOptions, build_space, recipe_for
from metainfer.core.engine.data import Dataset
from metainfer.core.engine.errors import InputError, MetainferError, fp32_failure
from metainfer.core.engine.evaluate import Screen
from metainfer.core.engine.history import HardwareFeatures as HistoryHardware
from metainfer.core.engine.history import (
    ModelFeatures,
    RunFeatures,
    SearchSpec,
    TrialHistory,
    quality_measure,
    warm_start,
)
from metainfer.core.engine.history_use import HistoryUse
from metainfer.core.engine.knobs.base import as_int
from metainfer.core.engine.knobs.quantizer import NNCF_RANKING, ranking_key
from metainfer.core.engine.measurer import Measurer, OnnxRuntimeMeasurer
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.phases import Observer, PipelinePhase, SilentObserver
from metainfer.core.engine.profile.types import HardwareProfile
from metainfer.core.engine.recipe import Recipe, TransformSpec
from metainfer.core.engine.reference import Reference, refuse_batch_mixing
from metainfer.core.engine.report import (
    AdaptSettings,
    FinalComparison,
    RejectedCandidate,
    Report,
    SloUnmetFallback,
    SpaceSummary,
)
from metainfer.core.engine.scoring import by_closeness, noise_band, rank, score, violations, within_noise
from metainfer.core.engine.search import Prior, SearchContext, Searcher, builtin_prior, context_features, make_searcher
from metainfer.core.engine.search.space import Key, Point, Scalar, Space
from metainfer.core.engine.sensitivity import SensitivityReport, accuracy_control, analyse
from metainfer.core.engine.transforms import (
    PaddingNotRemovable,
    build_variant,
    check_padding_removable,
    quantizable_nodes,
)
from metainfer.core.engine.transforms.fusion import fuse_transformer
from metainfer.core.engine.transforms.quantize_nncf import nncf_available
from metainfer.core.engine.transforms.weights import available_weight_methods, embedding_tables, weight_matmuls
from metainfer.core.engine.trial import Quality, Trial, TrialMetrics, TrialStatus
from metainfer.core.engine.validate import ValidationReport, validate_variant

VARIANT_CACHE_SIZE = 4
# A warm-started search stops once this share of the budget (at least CONVERGED_MIN trials) in a row
# brought nothing beyond the timing noise band: the history already pointed at the answer.
CONVERGED_SHARE = 0.25
CONVERGED_MIN = 4
MIN_STATIC_SAMPLES = 8
MAX_VALIDATION_ATTEMPTS = 3
# FP32 with tuned session settings validated once every ranked candidate failed, before the FP32 baseline; not
# counted in MAX_VALIDATION_ATTEMPTS: FP32 always gets its chance.
FP32_FALLBACK_ATTEMPTS = 3
SENSITIVITY_SAMPLES = 32
# Mixed-precision points passed over without measuring (scan_gate) before the search stops, per trial of budget.
PASS_OVER_LIMIT = 4
# Racing: a candidate whose running median is this much slower than the best so far (or three noise bands,
# whichever is more) cannot win on speed, so its timing stops after one round.
RACE_MARGIN = 0.3


class Adaptation:
    """State of one adaptation; ``run()`` drives it and returns the report and variant bytes."""

    def __init__(
        self,
        base: bytes,
        model: ModelInfo,
        data: Dataset,
        profile: HardwareProfile,
        settings: AdaptSettings,
        observer: Observer | None = None,
        measurer: Measurer | None = None,
        history: TrialHistory | None = None,
    ) -> None:
        self.base, self.model, self.data, self.profile, self.settings = base, model, data, profile, settings
        self.history = history
        self.observer: Observer = observer or SilentObserver()
        self.measurer: Measurer = measurer or OnnxRuntimeMeasurer()
        _check_batch(model, settings, data)
        self.calibration = data.head(settings.calibration_samples)
        self.quality_data = data.head(settings.measure.quality_samples)
        self._variants: OrderedDict[str, bytes] = OrderedDict()
        self._sensitivity: dict[str, SensitivityReport] = {}
        self._sensitivity_failed: dict[str, Exception] = {}
        self.reference: Reference | None = None
        self._full_reference: Reference | None = None  # FP32's outputs on all the data, for validation
        self.band = noise_band([], settings.measure.stable_rel)  # updated with every measurement
        self.sensitivity_s = 0.0  # wall time of the sensitivity scans, spent inside the search
        self._kept_counts: tuple[Scalar, ...] = (0,)  # the keep_float choices the space offers (set with the space)
        self._most_kept_in_float = 0  # the largest of them
        self._leader_p50_ms: float | None = None  # the best feasible median so far, for racing

    # -- building blocks ------------------------------------------------------
    def variant(self, recipe: Recipe) -> bytes:
        key = recipe.transform_key()
        if key not in self._variants:
            self._variants[key] = build_variant(self.base, recipe.transform, self.calibration)
            while len(self._variants) > VARIANT_CACHE_SIZE:
                self._variants.popitem(last=False)
        self._variants.move_to_end(key)
        return self._variants[key]

    def ranked_layers(self, mode: str) -> list[str]:
        if mode in self._sensitivity_failed:  # analysed once, failed once: do not pay for it again
            raise self._sensitivity_failed[mode]
        try:
            return self._ranked_layers(mode)
        except Exception as exc:
            self._sensitivity_failed[mode] = exc
            raise

    def _ranked_layers(self, key: str) -> list[str]:
        """The layer ranking ``key`` (scan_gate.ranking_key) names, made once."""
        if key not in self._sensitivity:
            assert self.reference is not None
            started = time.perf_counter()
            if key == NNCF_RANKING:
                self.observer.phase(PipelinePhase.SENSITIVITY, None, detail="NNCF accuracy control")
                self._sensitivity[key] = accuracy_control(
                    self.base,
                    self.calibration,
                    self.quality_data.head(SENSITIVITY_SAMPLES),
                    self._small_reference(),
                    self.settings.batch,
                    self.settings.constraints.max_quality_drop,
                    max_kept=self._most_kept_in_float,
                )
            else:
                self.observer.phase(PipelinePhase.SENSITIVITY, self.settings.sensitivity_layers, detail=key)
                self._sensitivity[key] = analyse(
                    self.base,
                    key,
                    self.calibration,
                    self.quality_data.head(SENSITIVITY_SAMPLES),
                    self._small_reference(),
                    self.settings.batch,
                    self.settings.sensitivity_layers,
                    on_step=lambda i, n, label: self.observer.advance(label),
                )
            self.sensitivity_s += time.perf_counter() - started
        return self._sensitivity[key].ranked()

    def _small_reference(self) -> Reference:
        assert self.reference is not None
        return self.reference.head(SENSITIVITY_SAMPLES)

    def measure(
        self, index: int, point: Point, recipe: Recipe, baseline: TrialMetrics | None, predicted: float | None = None
    ) -> Trial:
        assert self.reference is not None
        started = time.perf_counter()
        try:
            metrics = self.measurer.measure(
                self.variant(recipe),
                recipe,
                self.data,
                self.quality_data,
                self.reference,
                self.settings.measure,
                screen=self._screen(baseline),
            )
        except Exception as exc:  # a candidate that cannot be built or run fails alone
            return Trial(
                index=index,
                point=point,
                recipe=recipe,
                status=TrialStatus.FAILED,
                error=_first_line(exc),
                predicted_score=predicted,
                wall_s=time.perf_counter() - started,
            )
        missed = violations(metrics, self.settings.constraints)
        value = None if missed else score(metrics, baseline or metrics, self.settings.objective)
        return Trial(
            index=index,
            point=point,
            recipe=recipe,
            status=TrialStatus.INFEASIBLE if missed else TrialStatus.FEASIBLE,
            metrics=metrics,
            score=value,
            violations=missed,
            predicted_score=predicted,
            wall_s=time.perf_counter() - started,
        )

    def _screen(self, baseline: TrialMetrics | None) -> Screen | None:
        """Early stops for a candidate: none for the baseline; racing only when speed decides the objective
        (a memory weight could make a slower, smaller variant win)."""
        if baseline is None:
            return None
        racing = self.settings.measure.racing and self.settings.objective.memory_weight == 0
        leader = self._leader_p50_ms
        stop_above = leader * (1 + max(RACE_MARGIN, 3 * self.band)) if racing and leader is not None else None
        return Screen(stop_above_ms=stop_above, max_quality_drop=self.settings.constraints.max_quality_drop)

    def _note_leader(self, trial: Trial) -> None:
        if trial.score is None or trial.metrics is None or trial.metrics.early_stop is not None:
            return
        p50 = trial.metrics.latency.p50_ms
        self._leader_p50_ms = p50 if self._leader_p50_ms is None else min(self._leader_p50_ms, p50)

    # -- the loop -----------------------------------------------------------------
    def run(self, resume: Sequence[Trial] = (), resumed_search_s: float = 0.0) -> tuple[Report, bytes | None]:
        """Adapt; ``resume`` are trials an interrupted attempt of the same run measured (its checkpoint), replayed
        into the searcher instead of measured again, and ``resumed_search_s`` the search time they took."""
        started_at, t0 = datetime.now(UTC), time.perf_counter()
        s = self.settings
        self.observer.phase(PipelinePhase.BASELINE, 1)
        baseline_recipe = Recipe(batch=s.batch)
        metric = s.constraints.quality_metric
        try:
            self.reference = self.measurer.reference(self.base, baseline_recipe, self.quality_data, metric)
        except MetainferError:
            raise
        except Exception as exc:  # ONNX Runtime refused the user's own model: the run fails with its reason
            raise fp32_failure(exc) from exc
        refuse_batch_mixing(self.reference, s.batch, s.constraints.max_quality_drop)
        baseline = self.measure(0, {}, baseline_recipe, None)
        if baseline.metrics is None:
            raise InputError("model", f"the FP32 model does not run on this machine: {baseline.error}")
        self._update_band(baseline, [])
        self._note_leader(baseline)
        self.observer.advance("baseline")
        space, notes = self._space()
        if left_out := self.reference.left_out():
            names = ", ".join(repr(name[:60]) for name in left_out[:8])
            notes.append(
                f"output(s) {names} left out of the quality comparison: their rows are the run's, not one sample's"
                " (a constant, the detections non-max suppression kept), so they change with the grouping of samples"
            )
        prior, history_use = self._prior(space, notes, quality_measure(baseline.metrics.quality))
        searcher = make_searcher(
            s.algorithm, space, s.seed, s.budget_trials, featurizer=self._featurizer(space), prior=prior
        )
        trials = self._replay(resume, space, searcher, baseline)
        if trials:
            notes.append(f"resumed after {len(trials)} trials measured by an interrupted attempt")
            self._update_band(baseline, trials)
            for trial in trials:
                self._note_leader(trial)
        self.observer.phase(PipelinePhase.SEARCH, s.budget_trials)
        search_started = time.perf_counter() - resumed_search_s
        stop_reason = "trial budget reached"
        passed_over = 0
        # Mixed-precision points waiting for their all-int8 version's result; first, the peers not yet measured.
        measured = {space.key(t.point) for t in trials}
        peers = anchor_points(space, s.batch, self.profile.machine.physical_cores)
        peer_keys = {space.key(p) for p in peers}
        deferred: list[Point] = [p for p in peers if space.key(p) not in measured]
        while len(trials) < s.budget_trials:
            if s.time_budget_s is not None and time.perf_counter() - search_started > s.time_budget_s:
                stop_reason = f"time budget of {s.time_budget_s:g} s reached"
                break
            asked = [deferred.pop(0)] if deferred else searcher.ask(1)
            if not asked:
                stop_reason = "search space exhausted"
                break
            point = asked[0]
            gate = scan_gate.decide(
                point, trials, {*self._sensitivity, *self._sensitivity_failed}, s.constraints.max_quality_drop,
                space.is_allowed,
            )  # fmt: skip
            if gate.action == "pass_over":
                searcher.tell(point, None)  # not a trial: nothing was measured, the budget is not spent
                passed_over += 1
                if passed_over > PASS_OVER_LIMIT * s.budget_trials:
                    stop_reason = "only mixed-precision points left, and their int8 versions need no float layers"
                    break
                continue
            if gate.action == "instead":
                deferred.append(point)
            point = gate.point
            predicted = searcher.predicted_score(point)
            try:
                recipe = recipe_for(point, self.ranked_layers)
            except Exception as exc:  # sensitivity analysis failed: this candidate fails, the search goes on
                recipe = recipe_for({**point, "keep_float": 0}, self.ranked_layers)
                trial = Trial(
                    index=len(trials) + 1,
                    point=point,
                    recipe=recipe,
                    status=TrialStatus.FAILED,
                    error=f"mixed precision: {_first_line(exc)}",
                    predicted_score=predicted,
                )
            else:
                trial = self.measure(len(trials) + 1, point, recipe, baseline.metrics, predicted)
            if trial.score is None and space.key(point) in peer_keys:
                # One tool's default missing the budget (NNCF's int8 at 0.94 cosine on a detector) would tell the
                # surrogate that int8 as a whole loses; it is only kept from being measured again.
                searcher.exclude(point)
            else:
                searcher.tell(point, trial.score)
            trials.append(trial)
            self._note_leader(trial)
            self._update_band(baseline, trials)
            rescue = self._rescue(trial, space, trials, deferred)
            if rescue is not None:
                deferred.append(rescue)
                notes.append(
                    f"{trial.recipe.describe()} missed only the quality budget ({trial.violations[0]}) and ran"
                    f" ahead of every candidate within it: its version with up to {rescue[scan_gate.KEEP_FLOAT]}"
                    " layer(s) kept in float was measured next"
                )
            self.observer.trial(trial, self._leader(baseline, trials))
            if history_use is not None and history_use.warm and self._converged(trials):
                stop_reason = (
                    f"converged: {self._patience()} trials in a row found nothing beyond the {self.band:.1%} timing"
                    " noise band, after starting from the history's predicted best"
                )
                break
        search_wall = time.perf_counter() - search_started
        if passed_over:
            notes.append(
                f"{passed_over} mixed-precision point(s) passed over unmeasured: their all-int8 versions met the"
                " quality budget or failed otherwise, so no sensitivity scan could change the pick"
            )
        if history_use is not None:
            history_use = self._account(history_use, trials, stop_reason)
        choice = self._choose_and_validate(baseline, trials)
        best, validation, variant, failed = choice.best, choice.validation, choice.variant, choice.failed
        final = None
        if best is not None and validation is not None and variant:
            best, validation, variant, final = self._final_comparison(
                baseline, trials, best, validation, variant, {t.index for t, _ in failed}
            )
        if final is not None and best is not None and best is not baseline and self._fp32_wins(baseline, best, final):
            # The search's measurements can be off (a noisy neighbour); the back-to-back re-measurement
            # decides, with the same objective and noise band, whether the winner beats what the user has.
            note = self._lost_to_fp32_note(best, final)
            failed_before = any(t is baseline for t, _ in failed)  # validated once, rejected: not again
            kept = None if failed_before else self._choose_and_validate(baseline, [])
            if kept is not None and kept.best is not None:
                best, validation, variant = kept.best, kept.validation, kept.variant
                note += "; the FP32 model with default session options is kept"
                final = final.model_copy(update={"kept_baseline": True, "note": note})
            else:  # FP32 itself fails validation: the validated winner is still the answer
                failed += kept.failed if kept is not None else []
                final = final.model_copy(update={"note": note + "; FP32 failed validation, so the winner is shipped"})
        slo_unmet = self._slo_unmet_fallback(baseline, trials, failed) if best is None else None
        rejected = [_rejected(t, v) for t, v in failed]
        report = Report(
            started_at=started_at,
            model=self.model,
            profile=self.profile,
            settings=s,
            space=SpaceSummary(
                dimensions={d.name: list(d.choices) for d in space.dimensions},
                allowed_points=len(space.allowed_keys()),
                notes=notes,
            ),
            baseline=baseline,
            trials=trials,
            best=best,
            validation=validation,
            final=final,
            sensitivity=list(self._sensitivity.values()),
            latency_noise_band=self.band,
            history=history_use,
            search_wall_s=search_wall,
            sensitivity_wall_s=self.sensitivity_s,
            total_wall_s=time.perf_counter() - t0,
            stop_reason=stop_reason,
            rejected_by_validation=rejected,
            fallback_note=_fallback_note(rejected, best) if choice.fell_back and best is not None else "",
            slo_unmet_fallback=slo_unmet,
            quality_granularity_note=self._granularity_note(baseline.metrics.quality),
        )
        return report, variant

    def _rescue(self, trial: Trial, space: Space, trials: list[Trial], deferred: list[Point]) -> Point | None:
        """``trial``'s mixed-precision counterpart to measure next (scan_gate.rescue): once per layer ranking, so
        not where a mixed-precision point of that ranking was measured or is waiting (a rescue included)."""
        mode = ranking_key(trial.point)
        waiting = [*deferred, *(t.point for t in trials)]
        if any(p.get(scan_gate.KEEP_FLOAT) and ranking_key(p) == mode for p in waiting):
            return None
        return scan_gate.rescue(trial, self._leader_p50_ms, self.band, self.settings.constraints.max_quality_drop,
                                self._kept_counts, space.is_allowed)  # fmt: skip

    def _replay(self, resume: Sequence[Trial], space: Space, searcher: Searcher, baseline: Trial) -> list[Trial]:
        """The checkpoint's trials, re-scored against this attempt's baseline and told to the searcher in their
        order (its asks depend only on its history, so the search continues as if never interrupted). A trial
        outside this attempt's space (another ORT build, other providers) is dropped: it would be measured anew."""
        assert baseline.metrics is not None
        replayed: list[Trial] = []
        seen: set[Key] = set()
        for prior in sorted(resume, key=lambda t: t.index)[: self.settings.budget_trials]:
            if not space.is_allowed(prior.point):
                continue
            key = space.key(prior.point)
            if key in seen:
                continue
            seen.add(key)
            trial = prior.model_copy(update={"index": len(replayed) + 1})
            if trial.metrics is not None:
                missed = violations(trial.metrics, self.settings.constraints)
                value = None if missed else score(trial.metrics, baseline.metrics, self.settings.objective)
                status = TrialStatus.INFEASIBLE if missed else TrialStatus.FEASIBLE
                trial = trial.model_copy(update={"violations": missed, "score": value, "status": status})
            searcher.tell(trial.point, trial.score)
            replayed.append(trial)
        return replayed

    def _space(self) -> tuple[Space, list[str]]:
        padding_reason = self._padding_not_removable()
        overrides: dict[str, tuple[object, ...]] = {k: tuple(v) for k, v in self.settings.overrides.items()}
        openvino_gap = self._openvino_gap(overrides)
        if openvino_gap:  # the knob offers runtimes by the profile; this model's ops decide for this model
            overrides["runtime"] = ("onnxruntime",)
        graph = onnx.load_from_string(self.base)
        allow_static = self.calibration.n_samples >= MIN_STATIC_SAMPLES
        options = SpaceOptions(
            batch=self.settings.batch,
            search_batch=self.settings.search_batch,
            allow_static=allow_static,
            padding_removable=padding_reason is None,
            nncf=nncf_available(),
            weight_layers=len(weight_matmuls(graph)),
            embedding_tables=len(embedding_tables(graph)),
            weight_methods=available_weight_methods(nncf=nncf_available(), calibration=allow_static),
            overrides=overrides,
        )
        layers = len(quantizable_nodes(graph, "int8_static"))
        space, notes = build_space(self.model, self.profile, options, min(layers, self.settings.sensitivity_layers))
        self._kept_counts = next((d.choices for d in space.dimensions if d.name == scan_gate.KEEP_FLOAT), (0,))
        self._most_kept_in_float = max(as_int(c) for c in self._kept_counts)
        if openvino_gap:
            notes.append(openvino_gap)
        if padding_reason and self.model.is_transformer:
            notes.append(f"padding removal left out: {padding_reason}")
        if not space.allowed_keys():
            raise InputError("search space", "no candidate is allowed on this hardware: " + "; ".join(notes))
        return space, notes

    def _openvino_gap(self, overrides: dict[str, tuple[object, ...]]) -> str | None:
        """Why OpenVINO cannot run this model here (the operations its CPU plugin lacks), or None."""
        if not self.profile.openvino.usable or "openvino" not in overrides.get("runtime", ("openvino",)):
            return None
        from metainfer.core.engine.runtime_openvino import unsupported_ops  # only where OpenVINO is installed

        missing = unsupported_ops(self.base)
        return f"runtime openvino left out: its CPU plugin does not run {', '.join(missing)}" if missing else None

    def _padding_not_removable(self) -> str | None:
        """Why the fused model admits no padding removal, or None when it does."""
        if not self.model.is_transformer:
            return "not a transformer"
        try:
            check_padding_removable(fuse_transformer(onnx.load_from_string(self.base)))
        except PaddingNotRemovable as exc:
            return str(exc)
        except Exception as exc:
            return f"transformer fusion failed: {_first_line(exc)}"
        return None

    def context(self) -> SearchContext:
        """The hardware and model facts the search's features and built-in prior read."""
        m = self.profile.machine
        return SearchContext.from_peaks(
            self.profile.peak_gemm_gflops_fp32,
            self.profile.peak_gemm_gflops_int8,
            m.logical_cores,
            m.physical_cores,
            self.model.is_transformer,
        )

    def features(self) -> RunFeatures:
        """This run as the history compares it: model, hardware class, search-relevant spec."""
        return RunFeatures(
            model=ModelFeatures.of(self.model),
            hardware=HistoryHardware.of(self.profile),
            spec=SearchSpec.of(self.settings),
        )

    def _featurizer(self, space: Space) -> Callable[[Point], np.ndarray]:
        """Hardware-aware features so the surrogate can tell a fast int8 machine from a slow one."""
        context = self.context()
        return lambda point: context_features(point, context)

    def _prior(self, space: Space, notes: list[str], measure: str) -> tuple[Prior | None, HistoryUse | None]:
        """The hybrid's prior: warmed by the history when there is one, else the built-in defaults."""
        if self.settings.algorithm != "hybrid":
            if self.history is not None and self.history.sources:
                notes.append(f"history ignored: only the hybrid search uses it, not {self.settings.algorithm}")
            return None, None
        if self.history is None:
            return builtin_prior(space, self.context()), None
        prior, use = warm_start(space, self.features(), self.history, measure)
        if use.warm:
            notes.append(
                f"warm start from {len(use.sources)} related source(s), {use.trials_used} trials; "
                f"{use.skipped_known_failures} known failure(s) skipped"
            )
        else:
            notes.append("history offered but no source is related enough to start from: cold start")
        return prior, use

    def _patience(self) -> int:
        return max(CONVERGED_MIN, math.ceil(CONVERGED_SHARE * self.settings.budget_trials))

    def _converged(self, trials: list[Trial]) -> bool:
        """The last ``_patience()`` trials improved on the best before them by no more than the noise band."""
        n = self._patience()
        if len(trials) <= n:
            return False
        before = [t.score for t in trials[:-n] if t.score is not None]
        recent = [t.score for t in trials[-n:] if t.score is not None]
        if not before:
            return False
        return not recent or max(recent) <= max(before) * (1 + self.band)

    def _account(self, use: HistoryUse, trials: list[Trial], stop_reason: str) -> HistoryUse:
        scored = [(t.score, -t.index, t.index) for t in trials if t.score is not None]
        found = max(scored)[2] if scored else None
        saved = self.settings.budget_trials - len(trials) if stop_reason.startswith("converged") else 0
        return use.model_copy(update={"best_found_at": found, "trials_saved": saved})

    def _choose_and_validate(self, baseline: Trial, trials: list[Trial]) -> _Choice:
        """The best-ranked feasible candidate that passes validation (at most MAX_VALIDATION_ATTEMPTS tried); when
        every one of them fails, FP32 (``_fp32_fallbacks``), so that a feasible FP32 is always an answer."""
        assert self.reference is not None and baseline.metrics is not None
        ranked = rank(
            [baseline, *trials], baseline.metrics, self.settings.objective, self.band, limit=MAX_VALIDATION_ATTEMPTS
        )
        failed: list[Rejection] = []
        self.observer.phase(PipelinePhase.VALIDATION, min(len(ranked), MAX_VALIDATION_ATTEMPTS))
        found = self._first_valid(ranked, failed)
        if found is not None:
            return _Choice(*found, failed=failed)
        if not failed:  # nothing feasible to validate
            return _Choice(None, None, None, failed=failed)
        fallbacks = self._fp32_fallbacks(baseline, trials, {t.index for t in ranked})
        if fallbacks:
            self.observer.phase(PipelinePhase.VALIDATION, len(fallbacks), detail="FP32 fallback")
            found = self._first_valid(fallbacks, failed)
        if found is None:  # the last report says why, as before the fallback existed
            return _Choice(None, failed[-1][1], None, failed=failed)
        return _Choice(*found, failed=failed, fell_back=True)

    def _first_valid(
        self, candidates: Sequence[Trial], failed: list[Rejection]
    ) -> tuple[Trial, ValidationReport, bytes] | None:
        """The first of ``candidates`` that passes validation, with its report and bytes; each one that fails is
        added to ``failed``."""
        for candidate in candidates:
            variant = self.variant(candidate.recipe)
            validation = self._validate(variant, candidate.recipe)
            self.observer.advance(candidate.recipe.describe())
            if validation.passed:
                return candidate, validation, variant
            failed.append((candidate, validation))
        return None

    def _fp32_fallbacks(self, baseline: Trial, trials: list[Trial], tried: Collection[int]) -> list[Trial]:
        """What to validate once every ranked candidate failed: the best-ranked feasible trials of the unchanged
        model (other session settings or batch; at most FP32_FALLBACK_ATTEMPTS), then the baseline when it is
        feasible itself; none tried already."""
        assert baseline.metrics is not None
        ranked = rank(trials, baseline.metrics, self.settings.objective, self.band)
        tuned = [t for t in ranked if _is_fp32(t.recipe) and t.index not in tried][:FP32_FALLBACK_ATTEMPTS]
        return tuned + ([baseline] if baseline.score is not None and baseline.index not in tried else [])

    def _slo_unmet_fallback(
        self, baseline: Trial, trials: list[Trial], failed: list[Rejection]
    ) -> SloUnmetFallback | None:
        """With no feasible candidate shipped: FP32 that misses only latency bounds, validated, for a cluster to keep
        serving with the SLO unmet. Tried nearest to the bounds first (at most FP32_FALLBACK_ATTEMPTS with tuned
        session settings, and the baseline); one over the memory limit or the quality budget never qualifies."""
        tried = {t.index for t, _ in failed}
        eligible = [
            t for t in by_closeness([baseline, *trials], self.settings.constraints)
            if _is_fp32(t.recipe) and self._misses_only_latency(t) and t.index not in tried
        ]  # fmt: skip
        tuned = [t for t in eligible if t is not baseline][:FP32_FALLBACK_ATTEMPTS]
        candidates = [t for t in eligible if t is baseline or t in tuned]
        if not candidates:
            return None
        self.observer.phase(PipelinePhase.VALIDATION, len(candidates), detail="FP32 fallback, SLO unmet")
        found = self._first_valid(candidates, failed)
        return SloUnmetFallback(trial=found[0], validation=found[1]) if found is not None else None

    def _misses_only_latency(self, trial: Trial) -> bool:
        """Whether ``trial`` was measured in full and misses latency bounds (p95, p99) and nothing else."""
        if trial.metrics is None or trial.metrics.early_stop is not None or not trial.violations:
            return False
        without_latency = self.settings.constraints.model_copy(update={"slo_p95_ms": None, "slo_p99_ms": None})
        return not violations(trial.metrics, without_latency)

    def _granularity_note(self, quality: Quality) -> str:
        """The report's note when the quality metric moves in steps coarser than the budget, else empty."""
        outputs = 1
        if quality.metric == "argmax_agreement" and self.reference is not None:  # averaged over its score outputs
            compared = [self.reference.outputs[i] for i in self.reference.compared()]
            outputs = max(1, len(quality_metrics.class_scores(compared)))
        budget = self.settings.constraints.max_quality_drop
        return quality_metrics.coarse_budget_note(quality.metric, quality.samples, budget, outputs) or ""

    def _validate(self, variant: bytes, recipe: Recipe) -> ValidationReport:
        """Validation of ``variant`` on the full data, against FP32's outputs on it (computed once)."""
        if self._full_reference is None:
            self._full_reference = self.measurer.reference(
                self.base, Recipe(batch=self.settings.batch), self.data, self.settings.constraints.quality_metric
            )
        return validate_variant(
            variant,
            recipe,
            self.data,
            self._full_reference,
            self.settings.constraints.max_quality_drop,
            largest_batch=self._largest_batch(),
        )

    def _largest_batch(self) -> int:
        """The largest batch validation runs at: the model's fixed batch, else up to 64 samples."""
        if not self.model.batch_is_dynamic:
            return self.settings.batch
        return max(self.settings.batch, min(64, self.data.n_samples))

    def _update_band(self, baseline: Trial, trials: list[Trial]) -> None:
        # A raced or screened candidate's few runs say nothing about how finely a full measurement resolves.
        measured = [
            t.metrics.latency for t in [baseline, *trials] if t.metrics is not None and t.metrics.early_stop is None
        ]
        self.band = noise_band(measured, self.settings.measure.stable_rel)

    def _leader(self, baseline: Trial, trials: list[Trial]) -> Trial | None:
        """The best trial so far, as the final choice would rank it."""
        assert baseline.metrics is not None
        leaders = rank([baseline, *trials], baseline.metrics, self.settings.objective, self.band, limit=1)
        return leaders[0] if leaders else None

    def _fp32_wins(self, baseline: Trial, best: Trial, final: FinalComparison) -> bool:
        """Whether FP32, if feasible, outranks the search's winner on the back-to-back latencies."""
        if baseline.score is None:
            return False
        objective = self.settings.objective
        fp32, winner = (
            trial.model_copy(update={"metrics": m, "score": score(m, final.baseline, objective)})
            for trial, m in ((baseline, final.baseline), (best, final.best))
        )
        if self._slower_at_the_slo_percentile(final):
            return True  # a variant faster at the median but slower in the tail the SLO is written in: not shipped
        return rank([winner, fp32], final.baseline, objective, self.band, limit=1)[0] is fp32

    def _lost_to_fp32_note(self, best: Trial, final: FinalComparison) -> str:
        """Why the search's winner lost to FP32 back to back: slower at the SLO's percentile, within the timing
        noise (where quality and memory decide), or plainly slower."""
        within = within_noise(final.baseline.latency, final.best.latency, self.band)
        tail = self._slower_at_the_slo_percentile(final)
        percentile = final.slo_percentile
        speedup = getattr(final.baseline.latency, f"{percentile}_ms") / getattr(final.best.latency, f"{percentile}_ms")
        return (
            f"the search's winner ({best.recipe.describe()}) re-measured at {final.speedup_p50:.2f}x of FP32"
            " back to back"
            + (
                f" at p50 but {speedup:.2f}x at {percentile}, the percentile the SLO is written in"
                if tail
                else f" (within the {self.band:.1%} timing noise, where quality and memory decide)"
                if within
                else ""
            )
        )

    def _slo_percentile(self) -> str:
        return "p99" if self.settings.constraints.slo_p99_ms is not None else "p95"

    def _slower_at_the_slo_percentile(self, final: FinalComparison) -> bool:
        field = f"{final.slo_percentile}_ms"
        fp32, winner = getattr(final.baseline.latency, field), getattr(final.best.latency, field)
        return bool(winner > fp32 * (1 + self.band))

    def _final_comparison(
        self,
        baseline: Trial,
        trials: list[Trial],
        best: Trial,
        validation: ValidationReport,
        variant: bytes,
        rejected: Collection[int] = (),
    ) -> tuple[Trial, ValidationReport, bytes, FinalComparison]:
        """FP32, the validated winner and its closest rivals of other kinds (``core.engine.runoff``), timed
        interleaved; the race's best that passes validation is the winner, compared with FP32 on those timings.
        The trials of ``rejected`` (indices) failed validation already: they do not race."""
        assert baseline.metrics is not None and best.metrics is not None
        s = self.settings
        entrants: list[tuple[Trial, bytes]] = [(best, variant)]
        contenders = [t for t in trials if t.index not in rejected]
        for rival in runoff.rivals(
            rank(contenders, baseline.metrics, s.objective, self.band), best, baseline.metrics, s.objective
        ):
            try:
                entrants.append((rival, self.variant(rival.recipe)))
            except Exception:  # measured in the search, so it built then; a rival that cannot now is left out
                continue
        self.observer.phase(PipelinePhase.FINAL_COMPARISON, 1)
        latencies = self.measurer.compare(
            [(self.base, baseline.recipe), *((v, t.recipe) for t, v in entrants)], self.data, s.batch, s.measure
        )
        self.observer.advance("done")
        fp32 = baseline.metrics.model_copy(update={"latency": latencies[0]})
        raced = list(zip(entrants, latencies[1:], strict=True))
        order = runoff.race_order([(t, lat) for (t, _), lat in raced], fp32, s.objective, s.constraints, self.band)
        chosen, note = 0, ""
        for i in order:
            if i == 0:
                break  # the search's winner, validated already
            rival, rival_variant = raced[i][0]
            check = self._validate(rival_variant, rival.recipe)
            if check.passed:
                chosen, validation, variant = i, check, rival_variant
                note = (
                    f"{rival.recipe.describe()} ran {raced[0][1].p50_ms / raced[i][1].p50_ms:.2f}x as fast as the"
                    f" search's winner ({best.recipe.describe()}) back to back, and was shipped instead"
                )
                break
        (winner, _), latency = raced[chosen]
        assert winner.metrics is not None
        w = winner.metrics.model_copy(update={"latency": latency})
        entries = [
            runoff.RunoffEntry(
                recipe=t.recipe.describe(),
                trial=t.index,
                search_p50_ms=t.metrics.latency.p50_ms if t.metrics is not None else 0.0,
                p50_ms=lat.p50_ms,
                p95_ms=lat.p95_ms,
                shipped=i == chosen,
            )
            for i, ((t, _), lat) in enumerate(raced)
        ]
        final = FinalComparison(
            baseline=fp32,
            best=w,
            speedup_p50=fp32.latency.p50_ms / w.latency.p50_ms,
            speedup_p95=fp32.latency.p95_ms / w.latency.p95_ms,
            slo_percentile=self._slo_percentile(),
            note=note,
            runoff=entries if len(entries) > 1 else [],
        )
        return winner, validation, variant, final


def _check_batch(model: ModelInfo, settings: AdaptSettings, data: Dataset) -> None:
    if data.one_sample_per_run and (settings.batch != 1 or settings.search_batch):
        raise InputError(
            "--batch",
            f"{data.why_one_sample_per_run()}, so every run holds one sample; use --batch 1 (and do not search the"
            " batch)",
        )
    batched = [i for i in model.inputs if i.name not in data.unbatched]
    fixed = {i.shape[0] for i in batched if i.shape and isinstance(i.shape[0], int)}
    if fixed and (settings.batch not in fixed or settings.search_batch):
        raise InputError(
            "--batch",
            f"the model's batch dimension is fixed at {sorted(fixed)}; use --batch {min(fixed)}"
            " (and do not search the batch)",
        )


# A rejected candidate in a note: at most this many failed checks, each cut to this many characters; at most
# REJECTED_NOTED candidates named.
CHECKS_NOTED = 3
CHECK_CHARS = 200
REJECTED_NOTED = 5

Rejection = tuple[Trial, ValidationReport]  # a candidate validation rejected, and its report


@dataclass(frozen=True)
class _Choice:
    """What validation chose: the trial, its report and bytes (None: nothing passed; the report is then the last
    failure's), the candidates rejected on the way, and whether the FP32 fallback is what passed."""

    best: Trial | None
    validation: ValidationReport | None
    variant: bytes | None
    failed: list[Rejection]
    fell_back: bool = False


def _is_fp32(recipe: Recipe) -> bool:
    """The unchanged model's bytes (session settings and batch may differ from the baseline's)."""
    return recipe.transform == TransformSpec()


def _rejected(trial: Trial, validation: ValidationReport) -> RejectedCandidate:
    checks = [f"{c.name}: {c.detail}"[:CHECK_CHARS] for c in validation.checks if not c.passed]
    if not checks:  # failed without a failed check: the full-data quality says why
        checks = [f"{validation.full_data_quality.metric} drop {validation.full_data_quality.drop:.4f}"]
    more = [f"{len(checks) - CHECKS_NOTED} more"] if len(checks) > CHECKS_NOTED else []
    return RejectedCandidate(
        trial=trial.index, recipe=trial.recipe.describe(), failed_checks=checks[:CHECKS_NOTED] + more
    )


def _fallback_note(rejected: Sequence[RejectedCandidate], shipped: Trial) -> str:
    """The report's note when every ranked candidate failed validation: which ones and why, and what shipped."""
    named = "; ".join(r.describe() for r in rejected[:REJECTED_NOTED])
    if len(rejected) > REJECTED_NOTED:
        named += f"; and {len(rejected) - REJECTED_NOTED} more"
    if _is_fp32(shipped.recipe):
        return (
            f"no variant passed validation on all the data: {named}; so the FP32 model is shipped, with the session"
            f" settings that passed it: {shipped.recipe.describe()}"
        )
    return (
        f"the best-ranked candidates failed validation on all the data: {named}; {shipped.recipe.describe()}"
        " passed it and is shipped"
    )


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {(text.splitlines()[0] if text else '')[:300]}"
