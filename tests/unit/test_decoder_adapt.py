"""core.engine.decoder.adapt: the decoder's candidates, measured and scored, the fastest within the SLOs shipped,
FP32 when nothing else is."""

import json
from pathlib import Path

import onnx
import pytest

from metainfer.agent.zoo.decoder import build_tiny_decoder
from metainfer.core.engine.decoder import adapt
from metainfer.core.engine.decoder.quality import reference_text
from metainfer.core.engine.decoder.signature import DecoderSignature, detect
from metainfer.core.engine.decoder.tokenizer import carried_tokenizer
from metainfer.core.engine.decoder.workload import DecoderWorkload
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.transforms import build_variant


def test_candidates_start_at_fp32_put_low_bits_first_and_keep_matmulnbits_off_openvino() -> None:
    recipes = adapt.candidates(["onnxruntime", "openvino"], [0], has_matmul_nbits=True, nncf=True)
    assert recipes[0] == Recipe()
    assert recipes[1].transform.weights.bits == 4 and recipes[1].session.runtime == "onnxruntime"
    on_openvino = [r for r in recipes if r.session.runtime == "openvino"]
    assert on_openvino and all(r.transform.weights.method != "rtn" or not r.transform.weights.bits for r in on_openvino)
    assert not adapt.candidates(["onnxruntime"], [0], has_matmul_nbits=False, nncf=False)[1].transform.weights.bits


def _tiny() -> tuple[bytes, DecoderSignature, list[int]]:
    """The tiny decoder, its signature, and the reference text in its tokens."""
    base = build_tiny_decoder()
    model = onnx.load_from_string(base)
    signature = detect(model)
    codec = carried_tokenizer({p.key: p.value for p in model.metadata_props})
    assert signature is not None and codec is not None
    return base, signature, codec.encode(reference_text())


def _run(constraints: adapt.DecoderConstraints, recipes: list[Recipe]) -> adapt.DecoderReport:
    base, signature, ids = _tiny()
    workload = DecoderWorkload(prompt_tokens=16, decode_tokens=4, concurrency=2, max_context=512)
    report, variant = adapt.adapt(base, signature, ids, ids[:16], workload, constraints, recipes,
                                  lambda b, r: build_variant(b, r.transform),
                                  lambda v, r: create_session(v, r))  # fmt: skip
    assert (variant is None) == (report.best is None)
    return report


def test_every_candidate_is_measured_and_scored_and_a_failing_one_ends_alone() -> None:
    int8 = Recipe.model_validate({"transform": {"weights": {"bits": 8, "block_size": 32}}})
    broken = Recipe.model_validate({"session": {"execution_provider": "NoSuchExecutionProvider"}})
    report = _run(adapt.DecoderConstraints(quality_tokens=128), [Recipe(), int8, broken])
    fp32, weights, failed = report.trials
    assert fp32.quality is not None and fp32.quality.perplexity_rise == 0 and fp32.quality.next_token_agreement == 1
    assert weights.status == "ok" and weights.measurement is not None and weights.weights_mib < fp32.weights_mib
    assert failed.status == "failed" and "NoSuchExecutionProvider" in failed.reason
    assert report.best in (0, 1)


def test_slos_nothing_meets_leave_no_candidate_and_say_what_each_missed() -> None:
    report = _run(adapt.DecoderConstraints(tpot_p95_ms=1e-6, max_memory_mib=0.01, quality_tokens=64), [Recipe()])
    assert report.best is None and report.shipped is None
    assert "TPOT p95" in report.baseline.reason and "memory" in report.baseline.reason


def test_a_perplexity_budget_of_zero_rejects_any_variant_that_moves_it() -> None:
    int4 = Recipe.model_validate({"transform": {"weights": {"bits": 4, "block_size": 32}}})
    report = _run(adapt.DecoderConstraints(max_perplexity_rise=0.0, quality_tokens=128), [Recipe(), int4])
    assert report.trials[1].quality is not None
    rise = report.trials[1].quality.perplexity_rise
    assert (report.trials[1].status == "rejected") == (rise > 0)
    if rise > 0:
        assert "perplexity" in report.trials[1].reason and report.best == 0


@pytest.mark.parametrize("field", ["ttft_p95_ms", "tpot_p95_ms", "max_memory_mib"])
def test_constraints_refuse_non_positive_bounds(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        adapt.DecoderConstraints(**{field: 0})


def test_metainfer_adapt_on_a_decoder_writes_the_shipped_variant_its_recipe_and_the_report(tmp_path: Path) -> None:
    from metainfer.agent.cli import main

    model = tmp_path / "tiny.onnx"
    model.write_bytes(build_tiny_decoder())
    out = tmp_path / "out"
    code = main(["adapt", str(model), "--out", str(out), "--prompt-tokens", "8", "--decode-tokens", "4",
                 "--concurrency", "2", "--budget-trials", "2", "--max-perplexity-rise", "1"])  # fmt: skip
    assert code == 0
    report = json.loads((out / "decoder-report.json").read_text())
    assert len(report["trials"]) == 2 and report["best"] in (0, 1)
    shipped = Recipe.model_validate_json((out / "recipe.json").read_text())
    assert shipped == Recipe.model_validate(report["trials"][report["best"]]["recipe"])
    variant = onnx.load(out / "variant.onnx")
    assert carried_tokenizer({p.key: p.value for p in variant.metadata_props}) is not None


def test_metainfer_adapt_refuses_a_workload_longer_than_the_context(tmp_path: Path) -> None:
    from metainfer.agent.cli import main

    model = tmp_path / "tiny.onnx"
    model.write_bytes(build_tiny_decoder())
    assert main(["adapt", str(model), "--out", str(tmp_path / "out"), "--prompt-tokens", "500"]) == 2


def test_the_shipped_bytes_are_what_serving_rebuilds_from_the_recipe_fp32_included() -> None:
    """Serving rebuilds a variant from its recipe and refuses bytes other than the run validated: the FP32
    candidate is built (stamped) like any other, not the base's own bytes."""
    base, signature, ids = _tiny()
    workload = DecoderWorkload(prompt_tokens=8, decode_tokens=2, concurrency=1, max_context=512)
    report, variant = adapt.adapt(
        base, signature, ids, ids[:8], workload, adapt.DecoderConstraints(quality_tokens=32), [Recipe()],
        lambda b, r: build_variant(b, r.transform), lambda v, r: create_session(v, r),
    )  # fmt: skip
    assert report.best == 0 and variant == build_variant(base, Recipe().transform) and variant != base


def test_the_logits_projection_is_found_and_offered_float_beside_int4() -> None:
    base, signature, _ = _tiny()
    head = adapt.logits_projection(onnx.load_from_string(base), signature)
    assert head is not None and head.startswith("MatMul")
    recipes = adapt.candidates(["onnxruntime"], [0], has_matmul_nbits=True, nncf=False, logits_matmul=head)
    assert recipes[1].transform.weights.keep_float == (head,) and recipes[1].transform.weights.bits == 4
    variant = build_variant(base, recipes[1].transform)
    nodes = onnx.load_from_string(variant).graph.node
    assert head in {n.name for n in nodes if n.op_type == "MatMul"}  # float, beside the attention's own MatMuls
    assert sum(n.op_type == "MatMulNBits" for n in nodes) == 2 * 6  # q, k, v, o, up, down of both layers
