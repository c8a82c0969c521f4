"""`make test`'s prefetch beside the Go builds: every step runs, a failed one is left to its tier, and what it builds
is built once when a tier asks for it at the same time. No network: the steps and the exporters are stand-ins."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hack import prefetch
from testkit import exports as exports_mod


def _steps(calls: list[str]) -> tuple[prefetch.Step, ...]:
    def ok(name: str) -> prefetch.Step:
        return prefetch.Step(name, lambda: calls.append(name) or "done", needs_root=name == "root step")

    def broken() -> str:
        calls.append("broken")
        raise RuntimeError("the index refused the download")

    return (ok("root step"), prefetch.Step("broken", broken, needs_root=False), ok("last"))


def test_a_failed_step_is_reported_and_the_next_still_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(prefetch, "STEPS", _steps(calls))
    monkeypatch.setattr(prefetch.os, "geteuid", lambda: 0)
    assert prefetch.main() == 1
    assert calls == ["root step", "broken", "last"]
    out = capsys.readouterr().out
    assert "broken: failed after" in out and "left to its tier: the index refused the download" in out
    assert "last: done" in out


def test_without_root_the_steps_that_need_it_are_skipped_and_said(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(prefetch, "STEPS", _steps(calls)[:1] + _steps(calls)[2:])
    monkeypatch.setattr(prefetch.os, "geteuid", lambda: 1000)
    assert prefetch.main() == 0
    assert calls == ["last"]
    assert "root step: skipped, needs root" in capsys.readouterr().out


def test_the_exports_are_built_once_when_the_prefetch_and_the_tier_ask_together(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    built: list[int] = []

    def export_all(flavours: Any, texts: list[str], directory: Path) -> dict[str, dict[str, Any]]:
        built.append(threading.get_ident())
        time.sleep(0.3)  # long enough for the second caller to find the first one building
        return {f.name: {"ok": False, "seconds": 0.0, "error": "stand-in exporter"} for f in flavours}

    monkeypatch.setattr(exports_mod, "_export_all", export_all)
    flavours = exports_mod.FLAVOURS[:2]
    results: list[exports_mod.ExportSet] = []
    callers = [
        threading.Thread(target=lambda: results.append(exports_mod.build_exports(flavours, tmp_path))) for _ in range(2)
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert len(built) == 1
    assert len(results) == 2 and results[0] == results[1]
    assert {e.error for e in results[0].exports.values()} == {"stand-in exporter"}
