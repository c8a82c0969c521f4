"""Node labels -> hardware classes (sets of nodes interchangeable for inference).

Pure functions the operator calls:
``classify_node`` reads the labels a ``LabelMapping`` names (defaults: NVIDIA
GPU Feature Discovery, the AMD and Intel labellers, Huawei Ascend, NFD CPU
labels) and ``group_nodes``/``select_groups`` turn a node list into the classes
a policy adapts to, each with a selector that schedules onto exactly its nodes.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, overload

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from metainfer.core.api.hardwareclass import AcceleratorVendor, HardwareClass
from metainfer.core.api.policy import HardwareSelection
from metainfer.core.engine.errors import InputError

# --- node labels -> classes ---------------------------------------------------------------------------------------
# A "source" is a tuple of label keys whose values are joined with "." (a version split over major/minor/rev labels);
# the first key must be present, later keys are appended while present. A field lists sources, first match wins, so
# newer and older labeller spellings of one value give the same string (and the same fingerprint).
LabelSource = tuple[str, ...]
_NFD = "feature.node.kubernetes.io/"
_GFD_DRIVER: tuple[LabelSource, ...] = (
    ("nvidia.com/cuda.driver-version.full",),
    ("nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver-version.minor",
     "nvidia.com/cuda.driver-version.revision"),
    ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev"),
)  # fmt: skip
_GFD_RUNTIME: tuple[LabelSource, ...] = (
    ("nvidia.com/cuda.runtime-version.full",),
    ("nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime-version.minor"),
    ("nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor"),
)
DEFAULT_CPU_FEATURES: tuple[str, ...] = (
    "AMXBF16", "AMXFP16", "AMXINT8", "AMXTILE", "AVX", "AVX2", "AVX512BF16", "AVX512BW", "AVX512CD", "AVX512DQ",
    "AVX512F", "AVX512FP16", "AVX512VL", "AVX512VNNI", "AVXVNNI", "AVXVNNIINT8", "F16C", "FMA3", "SSE4", "SSE42",
    "ASIMD", "ASIMDDP", "ASIMDHP", "BF16", "I8MM", "SVE", "SVE2", "SME", "FPHP", "RVV",
)  # fmt: skip


class _Config(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


_PROFILE = "{profile}"
# What a profile must be to become part of a resource name (a label value is untrusted; this also fits the
# qualified-name syntax of extended resources).
_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


class PartitionLabels(_Config):
    """A vendor's devices split into partitions that a node advertises per profile, each profile its own extended
    resource: NVIDIA MIG under GPU Feature Discovery's "mixed" strategy (``nvidia.com/mig-1g.5gb.count``,
    ``.memory``; resource ``nvidia.com/mig-1g.5gb``), where the product label names the whole GPU and
    ``nvidia.com/gpu`` may be zero. Such a node is classed by the profile it has most of (ties: less memory, then
    the name), named as the "single" strategy names it, and its Jobs and pods request one of that profile."""

    when: dict[str, str] = Field(min_length=1, description="Labels (all of them) that say the node is partitioned.")
    count: str = Field(description="Label key of a profile's instance count; {profile} stands for the profile.")
    memory: str | None = Field(None, description="Label key of a profile's memory in MiB; {profile} as above.")
    profile: str = Field(r"[0-9]+g\.[0-9]+gb", description="Regular expression a profile must match in full.")
    resource: str = Field(description="Extended resource of one partition; {profile} as above.")
    product: str = Field("{product}-MIG-{profile}", description="The class's product; {product}: the device's.")

    @field_validator("count", "memory", "resource")
    @classmethod
    def _names_the_profile_once(cls, value: str | None) -> str | None:
        if value is not None and value.count(_PROFILE) != 1:
            raise ValueError(f"must contain {_PROFILE} exactly once")
        return value

    @field_validator("profile")
    @classmethod
    def _compiles(cls, value: str) -> str:
        re.compile(value)
        return value

    def profile_of(self, key: str) -> str | None:
        """The profile a count label key names, or None when ``key`` is not one."""
        prefix, suffix = self.count.split(_PROFILE)
        if not (key.startswith(prefix) and key.endswith(suffix)) or len(key) <= len(prefix) + len(suffix):
            return None
        profile = key[len(prefix) : len(key) - len(suffix)]
        return profile if re.fullmatch(self.profile, profile) else None

    def is_profile_key(self, key: str) -> bool:
        return any(
            key.startswith(prefix) and key.endswith(suffix) and len(key) > len(prefix) + len(suffix)
            for prefix, suffix in (t.split(_PROFILE) for t in (self.count, self.memory) if t is not None)
        )


class VendorLabels(_Config):
    """Which labels identify one accelerator vendor's nodes and feed each HardwareClass field."""

    vendor: AcceleratorVendor
    detect: tuple[str, ...] = Field(min_length=1, description="The node has this vendor if any key is present.")
    detect_prefix: str = Field("", description="...and its value starts with this (accelerator=huawei-...).")
    product: tuple[LabelSource, ...] = ()
    memory: tuple[LabelSource, ...] = ()
    memory_unit: Literal["MiB", "bytes"] = Field("MiB", description="Unit of a bare number (suffixes win).")
    compute_capability: tuple[LabelSource, ...] = ()
    driver_version: tuple[LabelSource, ...] = ()
    runtime_version: tuple[LabelSource, ...] = ()
    resource: str | None = Field(None, description="Extended resource; {value} = detect value minus the prefix.")
    partitions: PartitionLabels | None = Field(None, description="How a node advertises partitioned devices.")

    @field_validator("product", "memory", "compute_capability", "driver_version", "runtime_version", mode="before")
    @classmethod
    def _strings_are_single_key_sources(cls, value: object) -> object:
        # Config convenience: ["a", ["b", "c"]] means the sources ("a",) and ("b", "c").
        if isinstance(value, list | tuple):
            return tuple((v,) if isinstance(v, str) else tuple(v) for v in value)
        return value

    def sources(self) -> tuple[tuple[LabelSource, ...], ...]:
        """Sources of memory, compute capability, driver and runtime (the optional fields, in _fields order)."""
        return (self.memory, self.compute_capability, self.driver_version, self.runtime_version)

    def label_keys(self) -> tuple[str, ...]:
        """Every label key this vendor reads."""
        keys = [*self.detect, *(k for s in self.product for k in s), *(self.partitions.when if self.partitions else ())]
        return tuple(dict.fromkeys([*keys, *(k for f in self.sources() for s in f for k in s)]))


DEFAULT_VENDORS: tuple[VendorLabels, ...] = (
    VendorLabels(
        vendor="nvidia",
        detect=("nvidia.com/gpu.product",),
        product=(("nvidia.com/gpu.product",),),
        memory=(("nvidia.com/gpu.memory",),),
        compute_capability=(("nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor"),),
        driver_version=_GFD_DRIVER,
        runtime_version=_GFD_RUNTIME,
        resource="nvidia.com/gpu",
        partitions=PartitionLabels(
            when={"nvidia.com/mig.strategy": "mixed"},
            count="nvidia.com/mig-{profile}.count",
            memory="nvidia.com/mig-{profile}.memory",
            resource="nvidia.com/mig-{profile}",
        ),
    ),
    VendorLabels(
        vendor="amd",
        detect=("amd.com/gpu.product-name", "amd.com/gpu.family"),
        product=(("amd.com/gpu.product-name",), ("amd.com/gpu.device-id",), ("amd.com/gpu.family",)),
        memory=(("amd.com/gpu.vram",),),
        compute_capability=(("amd.com/gpu.family",),),
        driver_version=(("amd.com/gpu.driver-version",),),
        resource="amd.com/gpu",
    ),
    VendorLabels(
        vendor="intel",
        detect=("gpu.intel.com/product", "gpu.intel.com/family"),
        product=(("gpu.intel.com/product",), ("gpu.intel.com/family",)),
        memory=(("gpu.intel.com/memory.max",),),
        memory_unit="bytes",
        compute_capability=(("gpu.intel.com/family",),),
        resource="gpu.intel.com/i915",
    ),
    VendorLabels(
        vendor="huawei",
        detect=("accelerator",),
        detect_prefix="huawei-",
        product=(("node.kubernetes.io/npu.chip.name",), ("accelerator",)),
        resource="huawei.com/{value}",
    ),
)


class LabelMapping(_Config):
    """How node labels become hardware classes; defaults follow GFD, the AMD/Intel labellers, Ascend and NFD.

    A cluster with its own labels loads one with ``from_file``: ``extraVendors`` take precedence over ``vendors``
    (a node is classified by the first vendor whose detect labels it has), and unknown keys are errors.
    """

    vendors: tuple[VendorLabels, ...] = DEFAULT_VENDORS
    extra_vendors: tuple[VendorLabels, ...] = ()
    arch: str = "kubernetes.io/arch"
    default_arch: str = "amd64"
    cpu_product: tuple[str, ...] = Field(
        (f"{_NFD}cpu-model.vendor_id", f"{_NFD}cpu-model.family", f"{_NFD}cpu-model.id"),
        description="Joined with '-' into the product of vendor cpu classes; 'generic' when none is present.",
    )
    cpu_feature_prefix: str = f"{_NFD}cpu-cpuid."
    cpu_features: tuple[str, ...] = Field(DEFAULT_CPU_FEATURES, description="Allow-list of features that count.")
    cpu_features_on_accelerators: bool = Field(
        False, description="Also split accelerator classes by host CPU features (off: the model runs on the device)."
    )

    @classmethod
    def from_file(cls, path: str | Path) -> LabelMapping:
        """Load YAML or JSON; an error names the file and the offending key."""
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise InputError(str(path), f"cannot read label mapping: {exc}") from exc
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            raise InputError(f"{path}: {where}", err["msg"]) from exc

    def all_vendors(self) -> tuple[VendorLabels, ...]:
        return (*self.extra_vendors, *self.vendors)

    @cached_property
    def class_cache(self) -> dict[tuple[tuple[str, str], ...], NodeClass | UnclassifiableNode]:
        """Classification memo per mapping instance: real clusters have thousands of nodes and a few classes."""
        return {}

    @cached_property
    def accelerator_keys(self) -> tuple[str, ...]:
        # Detect keys without a value prefix: absent on CPU nodes (a prefixed key may carry other values).
        return tuple(dict.fromkeys(k for v in self.all_vendors() if not v.detect_prefix for k in v.detect))

    @cached_property
    def relevant_keys(self) -> frozenset[str]:
        keys = {self.arch, *self.cpu_product, *(k for v in self.all_vendors() for k in v.label_keys())}
        return frozenset(keys | {self.cpu_feature_prefix + f for f in self.cpu_features})

    @cached_property
    def partition_specs(self) -> tuple[PartitionLabels, ...]:
        return tuple(v.partitions for v in self.all_vendors() if v.partitions is not None)

    def is_relevant(self, key: str) -> bool:
        """Whether a label key can change a node's class (the partition labels' keys name their profiles)."""
        return key in self.relevant_keys or any(p.is_profile_key(key) for p in self.partition_specs)


@dataclass(frozen=True)
class NodeClass:
    """A node's class, and how to schedule onto exactly that class.

    ``selector`` is a nodeSelector (labels every node of the class has). ``absent`` lists keys the class's nodes
    lack; a nodeSelector cannot say "absent", so ``node_affinity()`` adds DoesNotExist terms that keep a CPU-only
    or AVX2-only workload off accelerator or AVX-512 nodes whose labels are a superset.
    """

    hardware_class: HardwareClass
    selector: dict[str, str]
    resource: str | None = None
    absent: tuple[str, ...] = ()

    @cached_property
    def fingerprint(self) -> str:
        return self.hardware_class.fingerprint()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.selector.items()) and not any(k in labels for k in self.absent)

    def node_affinity(self) -> dict[str, Any] | None:
        if not self.absent:
            return None
        exprs = [{"key": k, "operator": "DoesNotExist"} for k in self.absent]
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": exprs}]}}}  # fmt: skip


@dataclass(frozen=True)
class ClassGroup(NodeClass):
    """A class with its nodes; selector/absent are what all of ``node_names`` share."""

    node_names: tuple[str, ...] = ()


def _read(labels: Mapping[str, str], sources: tuple[LabelSource, ...], used: dict[str, str]) -> str | None:
    for source in sources:
        if source[0] not in labels:
            continue
        parts = list(itertools.takewhile(lambda k: k in labels, source))
        used.update((k, labels[k]) for k in parts)
        return ".".join(labels[k] for k in parts)
    return None


def _mebibytes(value: str | None, unit: str) -> int | None:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*", value or "", re.IGNORECASE)
    if not match:
        return None
    number, prefix = float(match[1]), match[2].upper()
    if not prefix:
        return int(number if unit == "MiB" else number / 2**20)
    # Labellers write 64G for 64 GiB of VRAM: suffixes are read as binary, with or without the "i".
    return int(number * 1024 ** ("KMGT".index(prefix) + 1) / 2**20)


class UnclassifiableNode(ValueError):
    """A node whose labels cannot form a hardware class: it is left out and reported; nothing else fails."""


# Node labels are untrusted: a value longer than the HardwareClass field that holds it is kept recognisable and
# distinct (its start and a hash of the whole) instead of making the class invalid. Selectors keep the real value.
_FIELD_LIMITS = {"product": 128, "compute_capability": 32, "driver_version": 64, "runtime_version": 64, "cpu_arch": 32}
_HASH_CHARS = 12
# Per device; anything larger is a broken or hostile label, not hardware (and would overflow the API's int64).
MAX_MEMORY_MIB = 2**40


@overload
def _fit(value: str, field: str) -> str: ...
@overload
def _fit(value: str | None, field: str) -> str | None: ...
def _fit(value: str | None, field: str) -> str | None:
    limit = _FIELD_LIMITS[field]
    if value is None or len(value) <= limit:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:_HASH_CHARS]
    return f"{value[: limit - _HASH_CHARS - 1]}~{digest}"


def classify_node(labels: Mapping[str, str], mapping: LabelMapping | None = None) -> NodeClass:
    """The class of a node from its labels (pure, cached on the labels the mapping reads).

    Raises UnclassifiableNode, naming the label, when the labels cannot form a class.
    """
    mapping = mapping or _DEFAULT_MAPPING
    relevant = tuple(sorted((k, v) for k, v in labels.items() if mapping.is_relevant(k)))
    cache = mapping.class_cache
    found = cache.get(relevant)
    if found is None:
        if len(cache) >= 4096:
            cache.clear()
        try:
            found = _classify(relevant, mapping)
        except UnclassifiableNode as exc:
            found = exc
        except (ValidationError, ValueError, OverflowError) as exc:
            found = UnclassifiableNode(f"labels do not form a hardware class: {_first_error(exc)}")
        cache[relevant] = found
    if isinstance(found, UnclassifiableNode):
        raise found
    return found


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
    return str(exc)[:200]


def _classify(relevant: tuple[tuple[str, str], ...], mapping: LabelMapping) -> NodeClass:
    labels = dict(relevant)
    used: dict[str, str] = {}
    arch = labels.get(mapping.arch)
    if arch is not None:
        used[mapping.arch] = arch
    outranked: list[str] = []  # detect keys of vendors that take precedence over the one found
    for v in mapping.all_vendors():
        hit = next((k for k in v.detect if k in labels and labels[k].startswith(v.detect_prefix)), None)
        if hit is None:
            if not v.detect_prefix:  # a prefixed key may carry other vendors' values: it cannot be "absent"
                outranked.extend(v.detect)
            continue
        used[hit] = labels[hit]
        features = _features(labels, mapping, used) if mapping.cpu_features_on_accelerators else ()
        product = _read(labels, v.product, used) or labels[hit].removeprefix(v.detect_prefix) or "generic"
        partition = _partition(labels, v.partitions, used) if v.partitions else None
        if partition is not None:
            product = partition.product(product)
        cls = HardwareClass(
            vendor=v.vendor,
            product=_fit(product, "product"),
            memory_mib=partition.memory_mib if partition is not None else _memory(labels, v, used),
            compute_capability=_fit(_read(labels, v.compute_capability, used), "compute_capability"),
            driver_version=_fit(_read(labels, v.driver_version, used), "driver_version"),
            runtime_version=_fit(_read(labels, v.runtime_version, used), "runtime_version"),
            cpu_arch=_fit(arch or mapping.default_arch, "cpu_arch"),
            cpu_features=features,
        )
        resource = v.resource.format(value=labels[hit].removeprefix(v.detect_prefix)) if v.resource else None
        if partition is not None:
            resource = partition.resource
        # A field read from no label must stay unread: any of its labels on a node would give another class.
        # A partitioned device's memory is its profile's: the whole device's memory label is no evidence.
        sources = v.sources() if partition is None else ((), *v.sources()[1:])
        unread = [src for src, value in zip(sources, _fields(cls), strict=True) if value is None]
        absent = {k for sources in unread for source in sources for k in source}
        # A node labelled for two vendors belongs to the one that takes precedence: keep this class's Jobs off it.
        absent.update(outranked)
        return NodeClass(cls, used, resource, tuple(sorted(absent)))
    product = "-".join(labels[k] for k in mapping.cpu_product if k in labels) or "generic"
    used.update((k, labels[k]) for k in mapping.cpu_product if k in labels)
    features = _features(labels, mapping, used)
    cls = HardwareClass(
        vendor="cpu",
        product=_fit(product, "product"),
        cpu_arch=_fit(arch or mapping.default_arch, "cpu_arch"),
        cpu_features=features,
    )
    absent = {*mapping.accelerator_keys, *(k for k in mapping.cpu_product if k not in labels)}
    absent |= {mapping.cpu_feature_prefix + f for f in mapping.cpu_features if f not in features}
    return NodeClass(cls, used, None, tuple(sorted(absent)))


@dataclass(frozen=True)
class _Partition:
    spec: PartitionLabels
    profile: str
    memory_mib: int | None

    def product(self, device: str) -> str:
        return self.spec.product.replace("{product}", device).replace(_PROFILE, self.profile)

    @property
    def resource(self) -> str:
        return self.spec.resource.replace(_PROFILE, self.profile)


def _partition(labels: Mapping[str, str], spec: PartitionLabels, used: dict[str, str]) -> _Partition | None:
    """The profile a partitioned node is classed by, and its memory; None when the node is not partitioned as
    ``spec`` says or advertises no usable profile."""
    if any(labels.get(k) != v for k, v in spec.when.items()):
        return None
    offered: list[tuple[int, int, str, int | None]] = []
    for key, value in labels.items():
        profile = spec.profile_of(key)
        if profile is None or not value.isdigit() or int(value) < 1 or not _RESOURCE.fullmatch(
            spec.resource.replace(_PROFILE, profile)
        ):  # fmt: skip
            continue
        memory_key = spec.memory.replace(_PROFILE, profile) if spec.memory else None
        memory = _mebibytes(labels.get(memory_key or ""), "MiB") if memory_key else None
        if memory is not None and not 0 < memory <= MAX_MEMORY_MIB:
            memory = None
        offered.append((-int(value), memory if memory is not None else MAX_MEMORY_MIB, profile, memory))
    if not offered:
        return None
    _, _, profile, memory = min(offered)
    used.update((k, labels[k]) for k in spec.when)
    memory_key = spec.memory.replace(_PROFILE, profile) if spec.memory else None
    # The selector names the profile: its memory label where there is one, else its count, whose value may
    # differ between nodes of the class (the group keeps what they share).
    evidence = memory_key if memory is not None and memory_key is not None else spec.count.replace(_PROFILE, profile)
    used[evidence] = labels[evidence]
    return _Partition(spec, profile, memory)


def _memory(labels: Mapping[str, str], vendor: VendorLabels, used: dict[str, str]) -> int | None:
    text = _read(labels, vendor.memory, used)
    try:
        mib = _mebibytes(text, vendor.memory_unit)
    except OverflowError:
        mib = MAX_MEMORY_MIB + 1
    if mib is not None and mib > MAX_MEMORY_MIB:
        keys = ", ".join(k for source in vendor.memory for k in source if k in labels)
        raise UnclassifiableNode(f"accelerator memory label {keys} = {(text or '')[:64]!r} is out of range")
    return mib


def _fields(cls: HardwareClass) -> tuple[object, ...]:
    return (cls.memory_mib, cls.compute_capability, cls.driver_version, cls.runtime_version)


def _features(labels: Mapping[str, str], mapping: LabelMapping, used: dict[str, str]) -> tuple[str, ...]:
    found = tuple(f for f in mapping.cpu_features if labels.get(mapping.cpu_feature_prefix + f) == "true")
    used.update((mapping.cpu_feature_prefix + f, "true") for f in found)
    return found


_DEFAULT_MAPPING = LabelMapping()


@dataclass(frozen=True)
class NodeClassification:
    """The classes of a node list, and the nodes that could not be classified (name -> why)."""

    groups: dict[str, ClassGroup]
    unclassified: dict[str, str]


def group_nodes(
    nodes: Iterable[tuple[str, Mapping[str, str]]], mapping: LabelMapping | None = None
) -> dict[str, ClassGroup]:
    """Nodes by class fingerprint (nodes that cannot be classified are left out: see ``classify_nodes``)."""
    return classify_nodes(nodes, mapping).groups


def classify_nodes(
    nodes: Iterable[tuple[str, Mapping[str, str]]], mapping: LabelMapping | None = None
) -> NodeClassification:
    """Nodes by class fingerprint; a group's selector/absent keys are those all its nodes share.

    A node whose labels cannot form a class is reported in ``unclassified`` and is in no group: one node's labels
    never stop the classification of the others.
    """
    acc: dict[str, tuple[NodeClass, dict[str, str], set[str], list[str]]] = {}
    unclassified: dict[str, str] = {}
    for name, labels in nodes:
        try:
            nc = classify_node(labels, mapping)
        except UnclassifiableNode as exc:
            unclassified[name] = str(exc)
            continue
        entry = acc.get(nc.fingerprint)
        if entry is None:
            acc[nc.fingerprint] = (nc, dict(nc.selector), set(nc.absent), [name])
            continue
        first, selector, absent, names = entry
        names.append(name)
        if nc is not first:  # another label spelling of the same class: keep only what both have
            for k in [k for k, v in selector.items() if nc.selector.get(k) != v]:
                del selector[k]
            absent.intersection_update(nc.absent)
    groups = {
        fp: ClassGroup(nc.hardware_class, selector, nc.resource, tuple(sorted(absent)), tuple(sorted(names)))
        for fp, (nc, selector, absent, names) in sorted(acc.items())
    }
    return NodeClassification(groups, unclassified)


def select_groups(
    groups: Mapping[str, ClassGroup],
    selection: HardwareSelection | None,
    node_labels: Mapping[str, Mapping[str, str]],
    excluded: Collection[str] = (),
) -> list[ClassGroup]:
    """The classes a policy adapts to, by fingerprint, at most ``max_classes``.

    With a nodeSelector only the nodes carrying all its labels count: a class is kept if any of its nodes matches,
    its node list shrinks to those, and the selector gains the policy's labels so Jobs and pods land only there.
    ``excluded`` nodes (cordoned, or tainted beyond the pods' tolerations: core.control.schedulability) count for
    nothing: a class of only such nodes is not selected, since no pod of the policy could run there.
    """
    selection = selection or HardwareSelection()
    wanted = dict(selection.node_selector or {})
    out: list[ClassGroup] = []
    for fp in sorted(groups):
        group = groups[fp]
        if selection.vendors and group.hardware_class.vendor not in selection.vendors:
            continue
        if wanted or excluded:
            names = tuple(
                n for n in group.node_names if n not in excluded and selector_matches(node_labels.get(n, {}), wanted)
            )
            if not names:
                continue
            group = replace(group, selector={**group.selector, **wanted}, node_names=names)
        out.append(group)
        if len(out) == selection.max_classes:
            break
    return out


def selector_matches(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """A node with these labels matches a nodeSelector of ``wanted``."""
    return all(labels.get(k) == v for k, v in wanted.items())


def unclassified_for(
    selection: HardwareSelection | None,
    unclassified: Mapping[str, str],
    node_labels: Mapping[str, Mapping[str, str]],
) -> dict[str, str]:
    """The unclassifiable nodes a policy would select (its nodeSelector matches them), by name: a policy hears
    only of nodes it could have used."""
    wanted = dict((selection or HardwareSelection()).node_selector or {})
    return {n: why for n, why in sorted(unclassified.items()) if selector_matches(node_labels.get(n, {}), wanted)}
