"""The run key (core.control.runkey), which decides whether a class re-adapts: it changes with what changes an
adaptation's result (model, batch size, class, search, runtime) and with nothing else, since a serving setting, a
credentials Secret or a spec field added later but unset would otherwise re-adapt every class of every policy."""

from __future__ import annotations

from manifest_inputs import policy

from metainfer.core.control.runkey import run_key


def test_run_key_changes_with_model_batch_class_and_search_but_not_serving() -> None:
    p = policy()
    key = run_key(p["spec"], 3, "0" * 16)
    assert run_key(p["spec"], 4, "0" * 16) == key  # generation alone (e.g. replicas edited) re-adapts nothing
    assert run_key(policy(serving={"replicas": 5})["spec"], 3, "0" * 16) == key
    assert run_key(p["spec"], 3, "1" * 16) != key
    assert run_key({**p["spec"], "model": {**p["spec"]["model"], "sha256": "b" * 64}}, 3, "0" * 16) != key
    assert run_key({**p["spec"], "slo": {"latencyP95Ms": 10, "batchSize": 8}}, 3, "0" * 16) != key
    assert run_key({**p["spec"], "search": {"trialBudget": 99}}, 3, "0" * 16) != key
    # The runtime the platform's image runs salts it: another ONNX Runtime re-adapts, the same one changes nothing.
    with_runtime = run_key(p["spec"], 3, "0" * 16, runtime="onnxruntime 1.20.0")
    assert with_runtime != key and with_runtime == run_key(p["spec"], 3, "0" * 16, runtime="onnxruntime 1.20.0")
    assert run_key(p["spec"], 3, "0" * 16, runtime="onnxruntime-gpu 1.20.0") != with_runtime


def test_a_spec_field_added_later_moves_no_run_key_until_it_is_set() -> None:
    p = policy()
    key = run_key(p["spec"], 3, "0" * 16)
    assert key == "f4160a6f0d8a5045"  # pinned: what the release before slo.qualityMetric and quantizers gave it
    assert run_key({**p["spec"], "slo": {**p["spec"]["slo"], "qualityMetric": "auto"}}, 3, "0" * 16) == key
    chosen = {**p["spec"], "slo": {**p["spec"]["slo"], "qualityMetric": "argmax_agreement"}}
    assert run_key(chosen, 3, "0" * 16) != key
    nncf = {**p["spec"], "searchSpace": {**p["spec"].get("searchSpace", {}), "quantizers": ["nncf"]}}
    assert run_key(nncf, 3, "0" * 16) != key
    tf32 = {**p["spec"], "searchSpace": {**p["spec"].get("searchSpace", {}), "cudaTf32": [False]}}
    assert run_key(tf32, 3, "0" * 16) != key


def test_naming_or_rotating_a_credentials_secret_re_adapts_nothing() -> None:
    model = {"uri": "s3://models/m.onnx", "sha256": "a" * 64}
    keys = {run_key(policy(model={**model, **extra})["spec"], 1, "fp") for extra in
            ({}, {"credentials": {"secretName": "keys"}}, {"credentials": {"secretName": "rotated"}})}  # fmt: skip
    assert len(keys) == 1
