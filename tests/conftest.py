"""The test tiers, by folder: the marker of each test is the tier it lives in.

A test's tier says what it needs, so `pytest -m unit` (or `make test-unit`) selects exactly the tests that need
nothing beyond the project's venv, and so on:

- ``unit``: pure functions and in-process objects: no network, no Go-built binary, no assertion on a duration;
- ``integration``: real processes (kube-apiserver + etcd, Prometheus, helm, `metainfer serve`, timed ONNX Runtime);
- ``e2e``: the product on a real node (root, containerd, the image);
- ``image``: the image of every runtime flavour, built without a container engine (root) and checked against the
  Dockerfile and the locks;
- ``exports``: models as other frameworks' exporters write them, made in peer environments (torch, optimum).

The marker comes from the folder, not from a decorator that a moved or new test could forget.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metainfer.agent.zoo import build_examples
from metainfer.core.engine.data import Dataset, load_npz
from metainfer.core.engine.modelinfo import ModelInfo, inspect_model
from metainfer.core.engine.profile import BenchConfig, HardwareProfile, measure_profile

TIERS = ("unit", "integration", "e2e", "image", "exports")
_ROOT = Path(__file__).resolve().parent


def tier_of(path: Path) -> str | None:
    """The tier of a test file: the first folder under tests/."""
    try:
        first = path.resolve().relative_to(_ROOT).parts[0]
    except (ValueError, IndexError):
        return None
    return first if first in TIERS else None


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: a test of the {tier} tier (set from its folder under tests/)")
    config.addinivalue_line(
        "markers",
        "alone: judges wall-clock latency under a load it makes itself, so no other test may run beside it "
        "(`make test-integration` runs the rest in parallel with pytest-xdist, then these one by one)",
    )


def _parallel(config: pytest.Config) -> bool:
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    return int(workers) > 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(Path(str(item.fspath)))
        if tier is None:
            raise pytest.UsageError(f"{item.nodeid}: every test lives in one of tests/{{{','.join(TIERS)}}}/")
        item.add_marker(getattr(pytest.mark, tier))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _parallel(item.config) and item.get_closest_marker("alone") is not None:
        pytest.fail(
            f"{item.nodeid} is marked `alone` (its latencies mean something only with no neighbour): "
            "select `-m 'not alone'` with -n, and run `-m alone` without it",
            pytrace=False,
        )


# -- small real models and a quick profile, for every tier ------------------------------------------------------
@pytest.fixture(scope="session")
def examples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("examples")
    built = build_examples(out, ["digits"])
    return {name: e.model_path for name, e in built.items()}


@pytest.fixture(scope="session")
def digits(examples: dict[str, Path]) -> tuple[bytes, ModelInfo, Dataset]:
    path = examples["digits"]
    info = inspect_model(path)
    return path.read_bytes(), info, load_npz(path.parent / "data.npz", info)


@pytest.fixture(scope="session")
def quick_profile() -> HardwareProfile:
    """A real profile of this machine with tiny benchmark sizes (a few seconds)."""
    return measure_profile(
        BenchConfig(
            op_runs=5, op_warmup=1, gemm_n=128, gemm_repeats=2, gemm_min_seconds=0, bandwidth_mib=4, bandwidth_repeats=2
        )
    )
