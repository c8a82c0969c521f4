"""BENCHMARKS.md is rendered from the saved results alone.

Rendering the committed bench/results/*.json (through the records of
bench/records.py) must give exactly the committed BENCHMARKS.md, so a section
can never drift from its data, and a result a record does not describe fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from bench import benchlib, render


def test_the_committed_results_render_to_the_committed_benchmarks_md() -> None:
    assert render.benchmarks_md() == benchlib.BENCHMARKS_MD.read_text()


def test_every_section_renders_from_its_json_alone() -> None:
    for name in render.SECTIONS:
        assert (benchlib.RESULTS / f"{name}.json").exists()
    stale = sorted(p.name for p in benchlib.RESULTS.glob("*.md"))
    assert not stale, f"{stale}: every section renders from its JSON, no markdown is kept"


@pytest.mark.parametrize("name", sorted(render.SECTIONS))
def test_a_field_no_record_declares_is_refused(name: str) -> None:
    saved = json.loads((benchlib.RESULTS / f"{name}.json").read_text())
    render.SECTIONS[name].record.model_validate(saved)
    with pytest.raises(ValidationError):
        render.SECTIONS[name].record.model_validate(saved | {"unexpected": 1})


def test_write_result_renders_a_data_section_from_its_json(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(benchlib, "RESULTS", tmp_path)
    monkeypatch.setattr(benchlib, "BENCHMARKS_MD", tmp_path / "BENCHMARKS.md")
    saved = json.loads((Path(render.__file__).parent / "results" / "pod_start.json").read_text())
    data = {k: v for k, v in saved.items() if k not in ("benchmark", "command", "machine")}
    data["median_s"] = {"rebuild": 2.0, "store": 0.5}
    benchlib.write_result("pod_start", render.SECTIONS["pod_start"].title, data, "python x.py", saved["machine"])
    assert not (tmp_path / "pod_start.md").exists()
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "Command: `python x.py`" in text and "saves 1.50 s per pod start (4.00x faster" in text
    (tmp_path / "serving.md").write_text("## A section someone wrote in markdown\n")
    assert "wrote in markdown" not in render.benchmarks_md(tmp_path)  # markdown beside the results is never stitched in
    with pytest.raises(ValueError, match="title"):
        benchlib.write_result("pod_start", "Another title", data, "python x.py", saved["machine"])
