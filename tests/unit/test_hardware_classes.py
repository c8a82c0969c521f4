"""Node labels -> hardware classes, on label sets as the real labellers write them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from metainfer.core.api.hardwareclass import HardwareClass
from metainfer.core.api.policy import HardwareSelection
from metainfer.core.control.hardware import (
    LabelMapping,
    UnclassifiableNode,
    VendorLabels,
    classify_node,
    classify_nodes,
    group_nodes,
    select_groups,
    unclassified_for,
)
from metainfer.core.engine.errors import InputError

NFD = "feature.node.kubernetes.io/"
# GPU Feature Discovery v0.8-style labels on a DGX A100 node (old and new driver spellings both present).
GFD_A100 = {
    "kubernetes.io/arch": "amd64",
    "kubernetes.io/hostname": "dgx-1",
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
    "nvidia.com/gpu.memory": "40960",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.family": "ampere",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/cuda.driver.major": "550",
    "nvidia.com/cuda.driver.minor": "54",
    "nvidia.com/cuda.driver.rev": "15",
    "nvidia.com/cuda.driver-version.full": "550.54.15",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "4",
    f"{NFD}cpu-cpuid.AVX512F": "true",
}
AMD_MI250 = {
    "kubernetes.io/arch": "amd64",
    "amd.com/gpu.product-name": "AMD_Instinct_MI250X_MI250",
    "amd.com/gpu.family": "AI",
    "amd.com/gpu.device-id": "740c",
    "amd.com/gpu.vram": "64G",
    "amd.com/gpu.driver-version": "6.7.0",
    "amd.com/gpu.cu-count": "104",
}
ASCEND_910 = {
    "kubernetes.io/arch": "arm64",
    "accelerator": "huawei-Ascend910",
    "accelerator-type": "module-910b-8",
    "node.kubernetes.io/npu.chip.name": "910B3",
}
INTEL_FLEX = {"kubernetes.io/arch": "amd64", "gpu.intel.com/product": "Flex_170", "gpu.intel.com/family": "A_Series"}
CPU_SPR = {
    "kubernetes.io/arch": "amd64",
    "kubernetes.io/os": "linux",
    f"{NFD}cpu-model.vendor_id": "Intel",
    f"{NFD}cpu-model.family": "6",
    f"{NFD}cpu-model.id": "143",
    f"{NFD}cpu-cpuid.AVX512VNNI": "true",
    f"{NFD}cpu-cpuid.AVX512F": "true",
    f"{NFD}cpu-cpuid.AMXINT8": "true",
    f"{NFD}cpu-cpuid.AVX2": "true",
    f"{NFD}cpu-cpuid.ADX": "true",  # not inference-relevant: ignored
    f"{NFD}cpu-hardware_multithreading": "true",
}
CPU_AVX2_ONLY = {
    "kubernetes.io/arch": "amd64",
    f"{NFD}cpu-model.vendor_id": "Intel",
    f"{NFD}cpu-model.family": "6",
    f"{NFD}cpu-model.id": "143",
    f"{NFD}cpu-cpuid.AVX2": "true",
}


def test_gpu_feature_discovery_node() -> None:
    nc = classify_node(GFD_A100)
    hc = nc.hardware_class
    assert (hc.vendor, hc.product, hc.memory_mib) == ("nvidia", "NVIDIA-A100-SXM4-40GB", 40960)
    assert (hc.compute_capability, hc.driver_version, hc.runtime_version) == ("8.0", "550.54.15", "12.4")
    assert hc.cpu_features == ()  # host CPU features do not split GPU classes by default
    assert nc.resource == "nvidia.com/gpu"
    assert nc.selector["nvidia.com/cuda.driver-version.full"] == "550.54.15"


def test_old_and_new_driver_labels_give_the_same_class() -> None:
    old = {k: v for k, v in GFD_A100.items() if "driver-version" not in k}
    new = {k: v for k, v in GFD_A100.items() if not k.startswith("nvidia.com/cuda.driver.")}
    assert classify_node(old).fingerprint == classify_node(new).fingerprint == classify_node(GFD_A100).fingerprint


def test_driver_upgrade_is_a_new_class() -> None:
    upgraded = {**GFD_A100, "nvidia.com/cuda.driver-version.full": "555.42.02", "nvidia.com/cuda.driver.major": "555"}
    assert classify_node(upgraded).hardware_class.driver_version == "555.42.02"
    assert classify_node(upgraded).fingerprint != classify_node(GFD_A100).fingerprint


def test_amd_mi250_node() -> None:
    nc = classify_node(AMD_MI250)
    hc = nc.hardware_class
    assert (hc.vendor, hc.product, hc.memory_mib, hc.driver_version) == (
        "amd",
        "AMD_Instinct_MI250X_MI250",
        65536,
        "6.7.0",
    )
    assert hc.compute_capability == "AI" and nc.resource == "amd.com/gpu"


def test_ascend_910_node() -> None:
    nc = classify_node(ASCEND_910)
    assert (nc.hardware_class.vendor, nc.hardware_class.product) == ("huawei", "910B3")
    assert nc.hardware_class.cpu_arch == "arm64"
    assert nc.resource == "huawei.com/Ascend910"
    assert classify_node({"accelerator": "huawei-Ascend310"}).resource == "huawei.com/Ascend310"
    assert classify_node({"accelerator": "something-else"}).hardware_class.vendor == "cpu"


def test_intel_gpu_node() -> None:
    nc = classify_node(INTEL_FLEX)
    assert (nc.hardware_class.vendor, nc.hardware_class.product, nc.resource) == (
        "intel",
        "Flex_170",
        "gpu.intel.com/i915",
    )


def test_cpu_node_with_nfd_labels() -> None:
    nc = classify_node(CPU_SPR)
    hc = nc.hardware_class
    assert (hc.vendor, hc.product, hc.cpu_arch) == ("cpu", "Intel-6-143", "amd64")
    assert hc.cpu_features == ("AMXINT8", "AVX2", "AVX512F", "AVX512VNNI")
    assert nc.resource is None
    bare = classify_node({"kubernetes.io/arch": "arm64"}).hardware_class
    assert (bare.vendor, bare.product, bare.cpu_arch, bare.cpu_features) == ("cpu", "generic", "arm64", ())


def test_selector_matches_own_nodes_and_no_others() -> None:
    nodes = {"gpu": GFD_A100, "amd": AMD_MI250, "npu": ASCEND_910, "xpu": INTEL_FLEX, "spr": CPU_SPR}
    nodes["avx2"] = CPU_AVX2_ONLY
    groups = group_nodes(nodes.items())
    assert len(groups) == 6
    for group in groups.values():
        (own,) = group.node_names
        for name, labels in nodes.items():
            assert group.matches(labels) == (name == own), (own, name)
    # a plain nodeSelector alone would put the AVX2-only class onto the AMX node: the affinity keeps it off
    avx2 = next(g for g in groups.values() if g.node_names == ("avx2",))
    assert all(CPU_SPR.get(k) == v for k, v in avx2.selector.items())
    terms = avx2.node_affinity()["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]  # type: ignore[index]
    keys = {e["key"] for e in terms["nodeSelectorTerms"][0]["matchExpressions"]}
    assert f"{NFD}cpu-cpuid.AVX512VNNI" in keys and "nvidia.com/gpu.product" in keys


def test_group_keeps_labels_all_nodes_share() -> None:
    old = {k: v for k, v in GFD_A100.items() if "driver-version" not in k}
    groups = group_nodes([("b", GFD_A100), ("a", old), ("c", GFD_A100)])
    (group,) = groups.values()
    assert group.node_names == ("a", "b", "c")
    assert "nvidia.com/cuda.driver-version.full" not in group.selector
    assert all(group.matches(labels) for labels in (old, GFD_A100))


def test_select_groups_node_selector_vendors_and_max() -> None:
    nodes = {
        "gpu-1": {**GFD_A100, "pool": "inference"},
        "gpu-2": GFD_A100,
        "spr-1": CPU_SPR,
        "amd-1": {**AMD_MI250, "pool": "inference"},
    }
    groups = group_nodes(nodes.items())
    picked = select_groups(groups, HardwareSelection(node_selector={"pool": "inference"}), nodes)
    assert sorted(g.hardware_class.vendor for g in picked) == ["amd", "nvidia"]
    gpu = next(g for g in picked if g.hardware_class.vendor == "nvidia")
    assert gpu.node_names == ("gpu-1",) and gpu.selector["pool"] == "inference"
    only_cpu = select_groups(groups, HardwareSelection(vendors=["cpu"]), nodes)
    assert [g.hardware_class.vendor for g in only_cpu] == ["cpu"]
    capped = select_groups(groups, HardwareSelection(max_classes=2), nodes)
    assert [g.fingerprint for g in capped] == sorted(groups)[:2]
    assert len(select_groups(groups, None, nodes)) == 3


def test_custom_mapping_from_file(tmp_path: Path) -> None:
    config = {
        "extraVendors": [
            {
                "vendor": "nvidia",
                "detect": ["example.com/accel"],
                "product": ["example.com/accel"],
                "driverVersion": [["example.com/drv.major", "example.com/drv.minor"]],
                "resource": "example.com/accel",
            }
        ],
        "cpuFeatures": ["AVX2"],
    }
    path = tmp_path / "mapping.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    mapping = LabelMapping.from_file(path)
    nc = classify_node(
        {"example.com/accel": "L4", "example.com/drv.major": "550", "example.com/drv.minor": "1"}, mapping
    )
    assert (nc.hardware_class.product, nc.hardware_class.driver_version, nc.resource) == (
        "L4",
        "550.1",
        "example.com/accel",
    )
    assert classify_node(GFD_A100, mapping).hardware_class.vendor == "nvidia"  # defaults still apply
    assert classify_node(CPU_SPR, mapping).hardware_class.cpu_features == ("AVX2",)
    assert isinstance(mapping.extra_vendors[0], VendorLabels)


def test_bad_mapping_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("extraVendors:\n  - vendor: nvidia\n    detect: [a]\n    prodcut: [b]\n")
    with pytest.raises(InputError, match=r"extraVendors\.0\.prodcut"):
        LabelMapping.from_file(path)
    path.write_text("cpuArch: amd64\n")
    with pytest.raises(InputError, match="cpuArch"):
        LabelMapping.from_file(path)


def test_group_nodes_on_a_thousand_nodes_is_cheap() -> None:
    kinds = [GFD_A100, AMD_MI250, CPU_SPR, CPU_AVX2_ONLY, ASCEND_910]
    nodes = [(f"node-{i:04d}", {**kinds[i % 5], "kubernetes.io/hostname": f"node-{i:04d}"}) for i in range(1000)]
    start = time.perf_counter()
    for _ in range(10):
        groups = group_nodes(nodes)
    elapsed = (time.perf_counter() - start) / 10
    print(f"group_nodes over 1000 nodes: {elapsed * 1000:.1f} ms")  # a sanity figure, not an assertion
    assert len(groups) == 5 and sum(len(g.node_names) for g in groups.values()) == 1000


# Node labels are untrusted input: one node must never stop the classification of the others.


def test_label_values_longer_than_a_class_field_are_kept_distinct_and_scheduled_by_their_real_value() -> None:
    long_a = "x86-64-" + "a" * 29  # 36 characters: the HardwareClass keeps 32 for the arch
    long_b = "x86-64-" + "a" * 28 + "b"
    nodes = {"n-a": {"kubernetes.io/arch": long_a}, "n-b": {"kubernetes.io/arch": long_b}, "n-ok": {}}
    classification = classify_nodes(nodes.items())
    assert classification.unclassified == {}
    groups = classification.groups
    assert len(groups) == 3, "values sharing a prefix stay distinct classes"
    by_node = {name: g for g in groups.values() for name in g.node_names}
    arch = by_node["n-a"].hardware_class.cpu_arch
    assert len(arch) <= 32 and arch.startswith("x86-64-") and arch != by_node["n-b"].hardware_class.cpu_arch
    assert by_node["n-a"].selector["kubernetes.io/arch"] == long_a, "the selector keeps the label's real value"
    gpu = {**GFD_A100, "nvidia.com/gpu.product": "P" * 300, "nvidia.com/cuda.driver-version.full": "9" * 100}
    cls = classify_node(gpu).hardware_class
    assert len(cls.product) == 128 and len(cls.driver_version or "") == 64


def test_a_node_whose_labels_form_no_class_is_reported_and_the_others_are_classified() -> None:
    overflow = {**GFD_A100, "nvidia.com/gpu.memory": "9" * 30}  # beyond int64 once in MiB
    huge = {**GFD_A100, "nvidia.com/gpu.memory": "9" * 400}  # float('9' * 400) is inf
    nodes = {"bad-1": overflow, "bad-2": huge, "good": GFD_A100}
    classification = classify_nodes(nodes.items())
    assert set(classification.unclassified) == {"bad-1", "bad-2"}
    assert "nvidia.com/gpu.memory" in classification.unclassified["bad-1"]
    ((group),) = classification.groups.values()
    assert group.node_names == ("good",)
    with pytest.raises(UnclassifiableNode):
        classify_node(overflow)


def test_a_policy_hears_only_of_unclassifiable_nodes_it_would_select() -> None:
    unclassified = {"gpu-bad": "memory out of range", "cpu-bad": "memory out of range"}
    labels = {"gpu-bad": {"pool": "gpu"}, "cpu-bad": {"pool": "cpu"}}
    assert unclassified_for(None, unclassified, labels) == unclassified
    selection = HardwareSelection(node_selector={"pool": "gpu"})
    assert unclassified_for(selection, unclassified, labels) == {"gpu-bad": "memory out of range"}


def test_a_node_labelled_for_two_vendors_gets_only_the_winning_vendors_jobs() -> None:
    # Classified NVIDIA (NVIDIA takes precedence), it also carries every label an AMD class selects on: without
    # DoesNotExist terms for the NVIDIA labels, the AMD class's Jobs could land on it.
    both = {**AMD_MI250, **GFD_A100}
    groups = group_nodes([("amd-1", AMD_MI250), ("both-1", both)])
    by_vendor = {g.hardware_class.vendor: g for g in groups.values()}
    assert by_vendor["nvidia"].node_names == ("both-1",) and by_vendor["amd"].node_names == ("amd-1",)
    assert not by_vendor["amd"].matches(both) and by_vendor["amd"].matches(AMD_MI250)
    assert by_vendor["nvidia"].matches(both)


def test_a_class_is_described_in_words_for_people_within_bounds() -> None:
    from metainfer.core.api.hardwareclass import DESCRIPTION_MAX

    gpu = HardwareClass(
        vendor="nvidia", product="A100-SXM4-80GB", memory_mib=81920, compute_capability="8.0",
        driver_version="535.104.05", runtime_version="12.2",
    )  # fmt: skip
    assert gpu.description() == "nvidia A100-SXM4-80GB 80 GiB, cc 8.0, driver 535.104.05, runtime 12.2"
    cpu = HardwareClass(vendor="cpu", product="Intel", cpu_features=("AVX512VNNI", "AVX2"))
    assert cpu.description() == "cpu Intel, amd64 AVX2 AVX512VNNI"
    long = HardwareClass(vendor="cpu", product="X" * 128, cpu_features=tuple(f"F{i}" for i in range(60)))
    assert len(long.description()) == DESCRIPTION_MAX and long.description().endswith("…")


# GFD on the same DGX A100 with MIG in the "mixed" strategy: the product label names the whole GPU, each MIG
# profile is its own resource (nvidia.com/mig-1g.5gb) with count and memory labels, nvidia.com/gpu may be 0.
GFD_A100_MIG_MIXED = {
    **GFD_A100,
    "nvidia.com/gpu.count": "0",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "mixed",
    "nvidia.com/mig-1g.5gb.count": "14",
    "nvidia.com/mig-1g.5gb.memory": "4864",
    "nvidia.com/mig-1g.5gb.multiprocessors": "14",
    "nvidia.com/mig-3g.20gb.count": "2",
    "nvidia.com/mig-3g.20gb.memory": "20096",
}
# The "single" strategy: every GPU in the same profile, named in the product, requested as nvidia.com/gpu.
GFD_A100_MIG_SINGLE = {
    **GFD_A100,
    "nvidia.com/mig.strategy": "single",
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
    "nvidia.com/gpu.memory": "4864",
    "nvidia.com/gpu.count": "56",
}


def test_a_mig_mixed_node_is_classed_by_its_most_offered_profile_and_requests_that_profiles_resource() -> None:
    """Issue 29 item 4: a Job requesting nvidia.com/gpu on such a node never schedules (it has none)."""
    mixed = classify_node(GFD_A100_MIG_MIXED)
    assert mixed.hardware_class.product == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert mixed.hardware_class.memory_mib == 4864 and mixed.resource == "nvidia.com/mig-1g.5gb"
    assert mixed.selector["nvidia.com/mig.strategy"] == "mixed"
    assert mixed.selector["nvidia.com/mig-1g.5gb.memory"] == "4864"
    assert "nvidia.com/gpu.memory" not in mixed.absent, "the whole GPU's memory label is on every such node"
    assert mixed.matches(GFD_A100_MIG_MIXED) and not mixed.matches(GFD_A100)
    # The same slice under the single strategy is the same hardware, requested by its own resource name.
    single = classify_node(GFD_A100_MIG_SINGLE)
    assert single.hardware_class == mixed.hardware_class and single.resource == "nvidia.com/gpu"
    # More 3g.20gb than 1g.5gb instances: the node is the larger profile's.
    more_3g = {**GFD_A100_MIG_MIXED, "nvidia.com/mig-3g.20gb.count": "20"}
    assert classify_node(more_3g).resource == "nvidia.com/mig-3g.20gb"
    assert classify_node(more_3g).hardware_class.memory_mib == 20096
    groups = group_nodes([("mig", GFD_A100_MIG_MIXED), ("full", GFD_A100)])
    assert {g.resource for g in groups.values()} == {"nvidia.com/mig-1g.5gb", "nvidia.com/gpu"}


def test_mig_labels_that_name_no_usable_profile_are_ignored_not_copied_into_resource_names() -> None:
    hostile = {
        **GFD_A100,
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-../../etc.count": "9",
        "nvidia.com/mig-1g.5gb; x.count": "9",
        "nvidia.com/mig-2g.10gb.count": "many",
        "nvidia.com/mig-3g.20gb.count": "0",
    }
    node = classify_node(hostile)
    assert node.resource == "nvidia.com/gpu" and node.hardware_class == classify_node(GFD_A100).hardware_class
    not_mixed = {**GFD_A100_MIG_MIXED, "nvidia.com/mig.strategy": "none"}
    assert classify_node(not_mixed).resource == "nvidia.com/gpu"


def test_a_mapping_can_describe_another_vendors_partitions(tmp_path: Path) -> None:
    path = tmp_path / "mapping.yaml"
    path.write_text(
        "extraVendors:\n"
        "  - vendor: nvidia\n"
        "    detect: [example.com/gpu.model]\n"
        "    product: [example.com/gpu.model]\n"
        "    resource: example.com/gpu\n"
        "    partitions:\n"
        "      when: {example.com/partitioned: 'yes'}\n"
        "      count: example.com/slice-{profile}.count\n"
        "      profile: '[0-9]+s'\n"
        "      resource: example.com/slice-{profile}\n"
        "      product: '{product}/{profile}'\n"
    )
    mapping = LabelMapping.from_file(path)
    labels = {"example.com/gpu.model": "X1", "example.com/partitioned": "yes", "example.com/slice-2s.count": "3"}
    node = classify_node(labels, mapping)
    assert node.hardware_class.product == "X1/2s" and node.resource == "example.com/slice-2s"
    assert node.selector["example.com/slice-2s.count"] == "3"
    with pytest.raises(InputError, match="exactly once"):
        path.write_text(
            "extraVendors:\n  - {vendor: nvidia, detect: [a], partitions: {when: {b: c}, count: x, resource: y}}\n"
        )
        LabelMapping.from_file(path)
