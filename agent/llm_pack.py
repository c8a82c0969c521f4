"""``metainfer llm-pack``: an exported decoder's directory made one servable file.

Exporters write a decoder as a directory: ``model.onnx`` (perhaps with ``model.onnx.data`` beside it),
``tokenizer.json``, ``tokenizer_config.json`` (special tokens; the chat template, or ``chat_template.jinja`` beside
it in newer transformers), ``config.json`` (``max_position_embeddings``) or ONNX Runtime GenAI's
``genai_config.json`` (``context_length``, ``eos_token_id``), and ``generation_config.json`` (the stop tokens).
metainfer moves one file per model and variant (the variant store, a ConfigMap, an object store), so this packs
what generation needs into the model's metadata, where serving and adaptation read it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx

from metainfer.core.engine.decoder.signature import detect
from metainfer.core.engine.decoder.tokenizer import embed_tokenizer
from metainfer.core.engine.errors import ModelError
from metainfer.core.engine.modelinfo import MAX_MODEL_BYTES, load_model


def pack(source: Path, out: Path) -> str:
    """Write ``out``; returns one line saying what it packed."""
    model_path = source / "model.onnx" if source.is_dir() else source
    directory = model_path.parent
    model = load_model(model_path)  # reads model.onnx.data and other external tensors beside it
    signature = detect(model)
    if signature is None:
        raise ModelError(str(model_path), "not a decoder (no past_key_values.<layer>.key/value inputs): only a "
                         "decoder needs its tokenizer packed")  # fmt: skip
    tokenizer = directory / "tokenizer.json"
    if not tokenizer.is_file():
        raise ModelError(str(tokenizer), "missing: a decoder's export directory holds its tokenizer.json")
    config = _json(directory / "tokenizer_config.json") or {}
    template = directory / "chat_template.jinja"
    if "chat_template" not in config and template.is_file():
        config["chat_template"] = template.read_text("utf-8")
    stops = _stop_ids(directory)
    if stops:
        config["stop_token_ids"] = stops
    context = _context(directory)
    embed_tokenizer(model, tokenizer.read_text("utf-8"), json.dumps(config), context)
    for tensor in model.graph.initializer:  # one file: the tensors read from beside it are stored inline
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    data = model.SerializeToString()
    if len(data) >= MAX_MODEL_BYTES:
        raise ModelError(str(model_path), f"{len(data) / 2**30:.1f} GiB packed is beyond what one ONNX file holds "
                         "(2 GiB): quantize its weights first")  # fmt: skip
    out.write_bytes(data)
    return (
        f"packed {model_path} ({len(signature.layers)} layers, {signature.form}) with its tokenizer"
        f"{', chat template' if 'chat_template' in config else ''}, context {context or 'unknown'}"
        f"{f', stop tokens {stops}' if stops else ''} into {out} ({len(data) / 2**20:.1f} MiB)"
    )


def _json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text("utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelError(str(path), f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ModelError(str(path), "not a JSON object")
    return value


def _context(directory: Path) -> int | None:
    config = _json(directory / "config.json") or {}
    genai = (_json(directory / "genai_config.json") or {}).get("model", {})
    for value in (config.get("max_position_embeddings"), genai.get("context_length")):
        if isinstance(value, int) and value > 1:
            return value
    return None


def _stop_ids(directory: Path) -> list[int]:
    ids: list[int] = []
    for name, keys in (("generation_config.json", ("eos_token_id",)), ("genai_config.json", ("model", "eos_token_id"))):
        value: Any = _json(directory / name) or {}
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int) and item not in ids:
                ids.append(item)
    return ids
