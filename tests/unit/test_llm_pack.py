"""metainfer llm-pack: an export directory (external data, tokenizer files, configs) made one servable file."""

import json
from pathlib import Path

import onnx
import pytest

from metainfer.agent.cli import main
from metainfer.agent.zoo.decoder import CHAT_TEMPLATE, build_tiny_decoder, tokenizer_json
from metainfer.core.engine.decoder.tokenizer import MAX_CONTEXT_KEY, carried_tokenizer


def _export_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "export"
    directory.mkdir()
    model = onnx.load_from_string(build_tiny_decoder(with_tokenizer=False))
    onnx.save(model, directory / "model.onnx", save_as_external_data=True, location="model.onnx.data",
              size_threshold=1024)  # fmt: skip
    (directory / "tokenizer.json").write_text(tokenizer_json())
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (directory / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [257, 259]}))
    return directory


def test_an_export_directory_with_external_data_packs_into_one_file_with_what_generation_needs(
    tmp_path: Path,
) -> None:
    directory = _export_dir(tmp_path)
    assert (directory / "model.onnx.data").stat().st_size > 100_000
    out = tmp_path / "packed.onnx"
    assert main(["llm-pack", str(directory), "-o", str(out)]) == 0
    packed = onnx.load(out, load_external_data=False)
    assert not any(t.external_data for t in packed.graph.initializer)
    metadata = {p.key: p.value for p in packed.metadata_props}
    codec = carried_tokenizer(metadata)
    assert codec is not None and metadata[MAX_CONTEXT_KEY] == "512"
    assert codec.stop_ids == {257, 259, codec.tokenizer.token_to_id("<|im_end|>")}
    assert codec.chat_prompt([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n")


def test_packing_names_what_is_missing_or_wrong(tmp_path: Path) -> None:
    directory = _export_dir(tmp_path)
    (directory / "tokenizer.json").unlink()
    assert main(["llm-pack", str(directory), "-o", str(tmp_path / "x.onnx")]) == 2
    from metainfer.agent.zoo.digits import build_digits

    onnx.save(build_digits().model, tmp_path / "digits.onnx")
    assert main(["llm-pack", str(tmp_path / "digits.onnx"), "-o", str(tmp_path / "y.onnx")]) == 2


def test_a_broken_config_file_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = _export_dir(tmp_path)
    (directory / "config.json").write_text("{oops")
    assert main(["llm-pack", str(directory), "-o", str(tmp_path / "x.onnx")]) == 2
    assert "config.json" in capsys.readouterr().err
