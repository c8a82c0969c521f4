"""Export all-MiniLM-L6-v2 the ways users export encoders; runs inside the exporters' venv.

bench/export_matrix.py starts it as

    EXPORT_VENV/bin/python bench/export_driver.py REQUEST.json

REQUEST.json: {"model_dir": ..., "out_dir": ..., "texts": [...], "seq_len": 128,
"flavours": [{"name": ..., "exporter": "torchscript"|"dynamo"|"optimum", "opset": N,
"attention": "eager"|"sdpa", "token_type_ids": bool, "mask_dtype": "int64"|"int32"}]}

For each flavour it writes OUT_DIR/NAME/model.onnx (external data folded in), and once
OUT_DIR/inputs.npz (the texts tokenised by the checkpoint's own tokenizer, padded to
seq_len) and OUT_DIR/torch_last_hidden_state.npy (PyTorch's FP32 output on them), so
the caller can check each export against the framework it came from. Nothing here
knows metainfer: this is what a user's export script does, one exporter at a time.
It prints one JSON line per flavour: {"name", "ok", "seconds", "error"}.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def _load(model_dir: str, attention: str) -> Any:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, attn_implementation=attention, add_pooling_layer=False)
    model.eval()
    return model


def _encoder(model: Any, token_type_ids: bool) -> Any:
    """The forward a feature-extraction export traces: last_hidden_state from the chosen inputs."""
    import torch

    class WithTokenTypes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    class WithoutTokenTypes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return WithTokenTypes() if token_type_ids else WithoutTokenTypes()


def _export_torch(flavour: dict[str, Any], model_dir: str, target: Path, inputs: dict[str, Any]) -> None:
    import torch

    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if flavour["token_type_ids"] else [])
    mask_dtype = getattr(torch, flavour["mask_dtype"])
    args = tuple(
        torch.from_numpy(inputs[n][:2]).to(mask_dtype if n == "attention_mask" else torch.int64) for n in names
    )
    wrapped = _encoder(_load(model_dir, flavour["attention"]), flavour["token_type_ids"])
    if flavour["exporter"] == "torchscript":
        axes = {n: {0: "batch", 1: "sequence"} for n in names} | {"last_hidden_state": {0: "batch", 1: "sequence"}}
        torch.onnx.export(
            wrapped,
            args,
            str(target),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=flavour["opset"],
            dynamo=False,
        )
    else:
        batch, sequence = torch.export.Dim("batch", min=1, max=1024), torch.export.Dim("sequence", min=2, max=512)
        program = torch.onnx.export(
            wrapped,
            args,
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_shapes={n: {0: batch, 1: sequence} for n in names},
            opset_version=flavour["opset"],
            dynamo=True,
        )
        program.save(str(target))


def _export_optimum(flavour: dict[str, Any], model_dir: str, target: Path) -> None:
    from optimum.exporters.onnx import main_export

    work = target.parent / "optimum"
    main_export(
        model_dir, output=work, task="feature-extraction", opset=flavour["opset"], no_post_process=False, device="cpu"
    )
    (work / "model.onnx").rename(target)
    for leftover in work.iterdir():
        leftover.unlink()
    work.rmdir()


def _fold_external_data(target: Path) -> None:
    """One self-contained file per flavour, as the engine reads it (the dynamo exporter may write data files)."""
    import onnx

    model = onnx.load(str(target), load_external_data=True)
    for extra in target.parent.iterdir():
        if extra != target:
            extra.unlink()
    onnx.save_model(model, str(target), save_as_external_data=False)


def _tokenise(model_dir: str, texts: list[str], seq_len: int) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=seq_len, return_tensors="np")
    return {k: v.astype("int64") for k, v in encoded.items()}


def _torch_reference(model_dir: str, inputs: dict[str, Any]) -> Any:
    import torch

    model = _load(model_dir, "eager")
    with torch.no_grad():
        feed = {k: torch.from_numpy(v) for k, v in inputs.items()}
        return model(**feed).last_hidden_state.numpy()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: export_driver.py REQUEST.json", file=sys.stderr)
        return 2
    import numpy as np
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    request = json.loads(Path(argv[0]).read_text())
    out_dir = Path(request["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs = _tokenise(request["model_dir"], request["texts"], request["seq_len"])
    np.savez(out_dir / "inputs.npz", **inputs)
    np.save(out_dir / "torch_last_hidden_state.npy", _torch_reference(request["model_dir"], inputs))
    for flavour in request["flavours"]:
        target = out_dir / flavour["name"] / "model.onnx"
        target.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        error = None
        try:
            if flavour["exporter"] == "optimum":
                _export_optimum(flavour, request["model_dir"], target)
            else:
                _export_torch(flavour, request["model_dir"], target, inputs)
            _fold_external_data(target)
        except Exception as exc:  # one exporter failing must not hide the others' results
            error = f"{type(exc).__name__}: {exc}"[:2000]
            traceback.print_exc(file=sys.stderr)
        line = {"name": flavour["name"], "ok": error is None, "seconds": time.perf_counter() - started, "error": error}
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
