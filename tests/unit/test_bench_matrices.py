"""The peer matrices' bookkeeping: partial reruns keep the rows they did not measure; Olive shows when it ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import benchlib, cnn_matrix


def _row(net: str, ms: float, **extra: object) -> dict[str, object]:
    row: dict[str, object] = {"net": net, "trained": True, "status": "measured", "metainfer_wall_s": 60.0}
    for name in ("fp32", "naive", "metainfer", "openvino_fp32", "openvino_nncf"):
        row |= {f"{name}_p50_ms": ms, f"{name}_p95_ms": ms * 1.1, f"{name}_quality": 0.999}
    row |= {"naive_wall_s": 1.0, "openvino_nncf_wall_s": 3.0, "recipe": "int8 static"}
    return row | extra


def test_a_partial_rerun_replaces_its_rows_and_keeps_the_others(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(benchlib, "RESULTS", tmp_path)
    saved = {"command": "python bench/cnn_matrix.py", "rows": [_row("a", 1.0), _row("b", 2.0), _row("c", 3.0)]}
    (tmp_path / "cnn_matrix.json").write_text(json.dumps(saved))
    monkeypatch.setattr(benchlib, "command_line", lambda: "python bench/cnn_matrix.py --only b d")
    rows, command = benchlib.merge_into_saved("cnn_matrix", [_row("d", 4.0), _row("b", 20.0)], "net")
    assert [(r["net"], r["fp32_p50_ms"]) for r in rows] == [("a", 1.0), ("b", 20.0), ("c", 3.0), ("d", 4.0)]
    assert command == "python bench/cnn_matrix.py && python bench/cnn_matrix.py --only b d"


def test_without_a_saved_result_the_rerun_is_the_result(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(benchlib, "RESULTS", tmp_path)
    rows, _ = benchlib.merge_into_saved("cnn_matrix", [_row("a", 1.0)], "net")
    assert [r["net"] for r in rows] == ["a"]


@pytest.mark.parametrize("with_olive", [False, True])
def test_the_olive_column_appears_only_where_olive_ran(with_olive: bool) -> None:
    olive = {"olive_p50_ms": 5.0, "olive_p95_ms": 6.0, "olive_quality": 0.998, "olive_wall_s": 900.0}
    olive |= {"olive_recipe": "int8 static per-channel; ORT_ENABLE_ALL"}
    rows = [_row("a", 10.0, **(olive if with_olive else {})), _row("b", 10.0)]
    text = cnn_matrix.render(rows, 24)
    header = next(line for line in text.splitlines() if line.startswith("| net"))
    assert ("Olive p50 / p95 ms" in header) is with_olive
    assert ("cosine naive / metainfer / olive / NNCF" in header) is with_olive
    if with_olive:
        assert "| 5.00 / 6.00 |" in text and "a: int8 static per-channel; ORT_ENABLE_ALL" in text
        assert "a: Olive beats metainfer by 2.00x faster at p50" in text
        row_b = next(line for line in text.splitlines() if line.startswith("| b "))
        assert "/ — /" in row_b  # b has no Olive wall time


def test_olive_contender_turns_olive_output_into_a_peer(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from bench import olive_output, olive_search

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
    )
    model = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), model)
    data = tmp_path / "data.npz"
    np.savez(data, x=np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))
    seen: dict[str, object] = {}

    def fake_run(venv: Path, config: dict[str, object], work: Path, timeout_s: float) -> olive_output.SearchOutcome:
        seen["config"] = config
        settings = {"intra_op_num_threads": 2, "graph_optimization_level": 2, "execution_mode": 1}
        detail = {"quantization": {"quant_mode": "static", "per_channel": True, "precision": "int8"}}
        detail["olive_candidates_evaluated"] = 7
        return olive_output.SearchOutcome("olive", 12.5, model, settings, detail)

    monkeypatch.setattr(olive_search, "ensure_olive", lambda venv: {"olive": "test"})
    monkeypatch.setattr(olive_search, "run_olive", fake_run)
    contender, row = olive_search.olive_contender("relu", model, data, 4, 8, tmp_path / "work", 60.0)
    assert contender == {
        "name": "olive",
        "kind": "ort",
        "model": str(model),
        "session": {
            "intra_op_num_threads": 2,
            "inter_op_num_threads": 0,
            "graph_optimization_level": "extended",
            "execution_mode": "parallel",
        },
    }
    assert row["olive_wall_s"] == 12.5 and row["olive_candidates"] == 7
    assert "int8 static" in row["olive_recipe"]
    config = seen["config"]
    assert isinstance(config, dict) and config["input_model"]["model_path"] == str(model)
    assert (tmp_path / "work" / "olive_reference.npz").exists()


def test_olive_failing_is_reported_not_raised(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from bench import olive_search

    def unavailable(venv: Path) -> dict[str, object]:
        raise olive_search.OliveUnavailable("no wheel for torch")

    monkeypatch.setattr(olive_search, "ensure_olive", unavailable)
    contender, row = olive_search.olive_contender("m", tmp_path / "m.onnx", tmp_path / "d.npz", 1, 8, tmp_path, 1.0)
    assert contender is None and "no wheel for torch" in row["olive_error"]


def test_metainfers_pick_is_timed_on_the_runtime_its_recipe_names() -> None:
    from bench import peer_table
    from metainfer.core.engine.recipe import Recipe

    on_openvino = Recipe.model_validate(
        {"session": {"runtime": "openvino", "intra_op_num_threads": 2, "openvino": {"inference_precision": "bf16"}}}
    )
    entry = peer_table.metainfer_contender(on_openvino, "variant.onnx")
    assert entry["kind"] == "openvino" and not entry["nncf"]
    assert entry["config"]["INFERENCE_PRECISION_HINT"] == "bf16" and entry["config"]["INFERENCE_NUM_THREADS"] == 2
    on_ort = peer_table.metainfer_contender(Recipe.model_validate({"session": {"intra_op_num_threads": 1}}), "v.onnx")
    assert on_ort["kind"] == "ort" and on_ort["session"]["intra_op_num_threads"] == 1


def test_the_peers_outputs_read_back_all_in_order_or_the_first_only(tmp_path: Path) -> None:
    import numpy as np

    from bench import peer_table

    first, second, third = np.zeros((2, 3)), np.ones((2, 1)), np.full((2, 4), 2.0)
    np.savez(tmp_path / "outputs.npz", **{"fp32": first, "fp32.2": third, "fp32.1": second, "naive": first})
    every = peer_table.read_outputs(tmp_path / "outputs.npz", every=True)
    assert [o.shape for o in every["fp32"]] == [(2, 3), (2, 1), (2, 4)] and len(every["naive"]) == 1
    assert [o.shape for o in peer_table.read_outputs(tmp_path / "outputs.npz", every=False)["fp32"]] == [(2, 3)]


def test_a_peer_is_credited_with_better_quality_only_where_it_shows_at_the_printed_precision() -> None:
    from bench.peer_table import peer_wins

    row = {"net": "m", "metainfer_p50_ms": 10.0, "metainfer_quality": 0.997800,
           "nncf_p50_ms": 10.1, "nncf_quality": 0.997804}  # fmt: skip
    assert peer_wins([row], "net", [("nncf", "NNCF")], lambda r, n: True) == []
    row["nncf_quality"] = 0.9979
    wins = peer_wins([row], "net", [("nncf", "NNCF")], lambda r, n: True)
    assert wins == ["m: NNCF beats metainfer by +0.0001 cosine"]
