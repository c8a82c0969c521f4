"""The test tiers, by folder: the marker of each test is the tier it lives in.

A test's tier says what it needs, so `pytest -m unit` (or `make test-unit`) selects exactly the tests that need
nothing beyond the project's venv, and so on:

- ``unit``: pure functions and in-process objects: no network, no Go-built binary, no assertion on a duration;
- ``integration``: real processes (kube-apiserver + etcd, Prometheus, helm, `metainfer serve`, timed ONNX Runtime);
- ``e2e``: the product on a real node (root, containerd, the image);
- ``exports``: models as other frameworks' exporters write them, made in peer environments (torch, optimum).

The marker comes from the folder, not from a decorator that a moved or new test could forget.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "integration", "e2e", "exports")
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(Path(str(item.fspath)))
        if tier is None:
            raise pytest.UsageError(f"{item.nodeid}: every test lives in one of tests/{{{','.join(TIERS)}}}/")
        item.add_marker(getattr(pytest.mark, tier))
