"""A decoder policy: slo.decoder instead of latencyP95Ms, its run key, its run status in per-token units."""

import pytest
from pydantic import ValidationError

from metainfer.core.api.policy import DecoderSlo, Slo
from metainfer.core.control.decoder_runs import decoder_metrics
from metainfer.core.engine.decoder.adapt import DecoderTrial
from metainfer.core.engine.decoder.quality import DecoderQuality
from metainfer.core.engine.decoder.workload import DecoderMeasurement, DecoderWorkload
from metainfer.core.engine.recipe import Recipe


def test_a_decoder_slo_stands_in_for_the_batch_latency_and_bounds_the_serving_series_per_token() -> None:
    slo = Slo.model_validate({"decoder": {"timePerOutputTokenP95Ms": 40, "timeToFirstTokenP95Ms": 500}})
    assert slo.latency_p95_ms is None and slo.serving_p95_ms == 40
    assert Slo.model_validate({"decoder": {}}).serving_p95_ms == float("inf")
    assert Slo.model_validate({"latencyP95Ms": 12, "decoder": {}}).serving_p95_ms == 12
    with pytest.raises(ValidationError, match="latencyP95Ms is required"):
        Slo.model_validate({})
    with pytest.raises(ValidationError, match="latencyP99Ms must be >= latencyP95Ms"):
        Slo.model_validate({"latencyP99Ms": 5, "decoder": {}})


@pytest.mark.parametrize(("field", "value"), [("promptTokens", 0), ("concurrency", 300), ("maxPerplexityRise", -1)])
def test_decoder_workload_fields_are_bounded(field: str, value: float) -> None:
    with pytest.raises(ValidationError):
        DecoderSlo.model_validate({field: value})


def test_the_crd_requires_a_latency_bound_or_a_decoder_section_by_cel() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "crds" / "metainfer.io_adaptationpolicies.yaml").read_text()
    assert "has(self.latencyP95Ms) || has(self.decoder)" in text and "timePerOutputTokenP95Ms" in text


def test_a_decoder_run_reports_per_token_metrics() -> None:
    workload = DecoderWorkload(prompt_tokens=8, decode_tokens=4)
    measurement = DecoderMeasurement(workload=workload, ttft_ms_p50=9, ttft_ms_p95=10, tpot_ms_p50=2, tpot_ms_p95=3,
                                     decode_tokens_per_s=500, aggregate_tokens_per_s=1500,
                                     kv_cache_mib_at_max_context=1)  # fmt: skip
    quality = DecoderQuality(tokens=100, next_token_agreement=0.9, perplexity=10.2, reference_perplexity=10.0)
    trial = DecoderTrial(recipe=Recipe(), status="ok", measurement=measurement, quality=quality, weights_mib=3)
    metrics = decoder_metrics(trial)
    assert metrics is not None and (metrics.p95_ms, metrics.p50_ms, metrics.throughput_per_s) == (3, 2, 1500)
    assert metrics.quality_metric == "perplexity_rise" and metrics.quality_drop == pytest.approx(0.02)
