"""CRDs are generated from core.api, structural, and the examples match the types."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from metainfer.core.api import (
    RESOURCES,
    AdaptationPolicy,
    AdaptationPolicySpec,
    HardwareProfileResource,
    crdgen,
    set_condition,
)
from metainfer.core.api.hardwareclass import HardwareClass
from metainfer.core.api.hardwareprofile import profile_name

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"
EXAMPLES = REPO / "examples"


def test_crds_are_not_stale() -> None:
    stale = crdgen.stale_files(CRDS)
    assert not stale, f"crds/ is stale ({', '.join(stale)}): run `python -m metainfer.core.api.crdgen crds/`"


def test_check_mode_detects_a_stale_file(tmp_path: Path) -> None:
    crdgen.write(tmp_path)
    assert crdgen.main([str(tmp_path), "--check"]) == 0
    victim = tmp_path / crdgen.filename(RESOURCES[0])
    victim.write_text(victim.read_text().replace("latencyP95Ms", "latencyP95"))
    assert crdgen.main([str(tmp_path), "--check"]) == 1
    assert crdgen.stale_files(tmp_path) == [victim.name]


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        out.append((path, node))
        for key, value in node.get("properties", {}).items():
            out += _walk(value, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            out += _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            out += _walk(node["additionalProperties"], f"{path}[*]")
    return out


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_schema_is_structural(resource: crdgen.Resource) -> None:
    schema = crdgen.openapi_schema(resource)
    for path, node in _walk(schema):
        assert not {"$ref", "anyOf", "oneOf", "allOf", "title", "const"} & node.keys(), path
        assert (
            "type" in node or node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        ), f"{resource.kind}{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(bound, False), bool), f"{path}: numeric {bound} is not OpenAPI v3"


def test_descriptions_make_kubectl_explain_useful() -> None:
    slo = crdgen.openapi_schema(RESOURCES[0])["properties"]["spec"]["properties"]["slo"]
    assert slo["description"]
    assert all(prop.get("description") for prop in slo["properties"].values())


def test_nested_settings_default_to_the_pydantic_defaults() -> None:
    """The server fills in the same defaults pydantic does (CEL rules rely on them being present)."""
    spec = crdgen.openapi_schema(RESOURCES[0])["properties"]["spec"]
    python_defaults = AdaptationPolicySpec.model_validate(
        {"model": {"uri": "https://x/m.onnx", "sha256": "a" * 64}, "slo": {"latencyP95Ms": 10}}
    ).to_api()
    for name in ("objective", "hardware", "searchSpace", "search", "serving", "rollout", "readaptation"):
        assert spec["properties"][name]["default"] == python_defaults[name], name
    assert spec["properties"]["search"]["properties"]["algorithm"]["default"] == "hybrid"
    assert "default" not in spec["properties"]["model"]  # required, no default


def test_unions_other_than_int_or_string_are_refused() -> None:
    class Bad(BaseModel):
        value: int | list[int]

    with pytest.raises(crdgen.CrdGenError, match=r"\.value: union"):
        crdgen.structural(Bad.model_json_schema(), path="spec")


def test_int_or_string_and_exclusive_bounds() -> None:
    from pydantic import Field

    class Quantities(BaseModel):
        cpu: int | str
        ratio: float = Field(gt=0)

    schema = crdgen.structural(Quantities.model_json_schema())
    assert schema["properties"]["cpu"] == {"x-kubernetes-int-or-string": True}
    assert schema["properties"]["ratio"]["minimum"] == 0
    assert schema["properties"]["ratio"]["exclusiveMinimum"] is True


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_validate_against_the_types(path: Path) -> None:
    doc = _load(path)
    model = {"AdaptationPolicy": AdaptationPolicy, "HardwareProfile": HardwareProfileResource}[doc["kind"]]
    obj = model.model_validate(doc)
    if isinstance(obj, HardwareProfileResource):
        assert obj.spec.hardware_class.fingerprint() == obj.spec.fingerprint
        assert doc["metadata"]["name"] == profile_name(obj.spec.fingerprint, obj.spec.namespace)


def test_policy_rules_also_hold_in_python_defaults() -> None:
    spec = AdaptationPolicySpec.model_validate(
        {"model": {"uri": "https://x/m.onnx", "sha256": "a" * 64}, "slo": {"latencyP95Ms": 10}}
    )
    # The CEL rule canaryReplicas < replicas must hold for the defaults.
    assert spec.rollout.canary_replicas < spec.serving.replicas
    assert spec.to_api()["slo"] == {
        "latencyP95Ms": 10.0,
        "maxQualityDrop": 0.01,
        "qualityMetric": "auto",
        "batchSize": 1,
    }


@pytest.mark.parametrize(
    "patch",
    [
        {"model": {"uri": "ftp://x/m.onnx", "sha256": "a" * 64}},
        {"model": {"uri": "https://x/m.onnx", "sha256": "A" * 64}},
        {"slo": {"latencyP95Ms": 0}},
        {"search": {"algorithm": "annealing"}},
    ],
)
def test_python_types_reject_what_the_crd_rejects(patch: dict[str, Any]) -> None:
    base: dict[str, Any] = {"model": {"uri": "https://x/m.onnx", "sha256": "a" * 64}, "slo": {"latencyP95Ms": 10}}
    with pytest.raises(ValidationError):
        AdaptationPolicySpec.model_validate({**base, **patch})


def test_hardware_class_fingerprint_is_stable_and_canonical() -> None:
    a = HardwareClass(vendor="cpu", product="Xeon", cpu_features=("AVX512VNNI", "AVX2"))
    b = HardwareClass.model_validate(
        {"vendor": "cpu", "product": "Xeon", "cpuFeatures": ["AVX2", "AVX512VNNI", "AVX2"]}
    )
    assert a.fingerprint() == b.fingerprint()
    assert len(a.fingerprint()) == 16
    gpu = HardwareClass(vendor="nvidia", product="NVIDIA-A100-SXM4-40GB", driver_version="550.54.15")
    upgraded = gpu.model_copy(update={"driver_version": "555.42.02"})
    assert gpu.fingerprint() != upgraded.fingerprint()
    assert gpu.name().startswith("nvidia-nvidia-a100") and len(gpu.name()) <= 40


def test_hardware_class_fingerprint_value_is_pinned() -> None:
    cls = HardwareClass(
        vendor="cpu",
        product="Intel-Xeon-Platinum-8480C",
        cpu_arch="amd64",
        cpu_features=("AVX512VNNI", "AVX512F", "AMXINT8"),
    )
    assert cls.fingerprint() == "a2f6bf266864a4f2"


def test_set_condition_moves_transition_time_only_on_status_change() -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    t1 = t0 + dt.timedelta(minutes=5)
    conds = set_condition([], "Ready", "False", "ClassesPending", "0/2", now=t0)
    conds = set_condition(conds, "Ready", "False", "ClassesPending", "1/2", now=t1)
    assert conds[0].last_transition_time == t0 and conds[0].message == "1/2"
    conds = set_condition(conds, "Ready", "True", "AllClassesReady", now=t1, observed_generation=3)
    assert conds[0].last_transition_time == t1 and conds[0].observed_generation == 3
    assert len(conds) == 1
    assert conds[0].to_api()["lastTransitionTime"] == "2026-01-01T00:05:00Z"
