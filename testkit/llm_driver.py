"""SmolLM2's exporters, run in the llm peer venv (bench/requirements-llm.txt) by testkit/llm_exports.py.

Standalone on purpose: it runs under that venv's interpreter, by path, and imports nothing of the project.

    python llm_driver.py prepare   GGUF HF_DIR      # dequantize the GGUF with transformers, save an HF folder
    python llm_driver.py optimum   HF_DIR OUT_DIR   # optimum's main_export, text-generation-with-past
    python llm_driver.py builder   HF_DIR OUT_DIR   # python -m onnxruntime_genai.models.builder -p fp32 -e cpu
    python llm_driver.py reference GGUF IDS.json OUT.npy   # transformers' logits for one sequence, [1, seq, vocab]

Each command prints one JSON line on stdout (what it made and how long it took); the tools' own chatter goes to
stderr, which the caller keeps as a log.

The tokenizer. transformers 4.57's GGUF conversion of this tokenizer contradicts the GGUF's own metadata: it
names ``<|im_start|>`` (id 1) as eos where ``tokenizer.ggml.eos_token_id`` is 2 (``<|im_end|>``), adds a
``<|im_start|>`` post-processor although ``tokenizer.ggml.add_bos_token`` is false (every chat prompt would start
with two of them), and drops the digit split of the ``smollm`` pre-tokenizer (llama.cpp's regex splits every
``\\p{N}``). ``prepare`` repairs tokenizer.json and tokenizer_config.json from the GGUF's metadata before any
exporter reads them, and writes the chat template into tokenizer_config.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf_tokenizer_facts(gguf: Path) -> dict[str, object]:
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields

    def value(key: str) -> object:
        return fields[key].contents() if key in fields else None

    return {
        "bos": value("tokenizer.ggml.bos_token_id"),
        "eos": value("tokenizer.ggml.eos_token_id"),
        "pad": value("tokenizer.ggml.padding_token_id"),
        "unk": value("tokenizer.ggml.unknown_token_id"),
        "add_bos": value("tokenizer.ggml.add_bos_token"),
        "pre": value("tokenizer.ggml.pre"),
        "chat_template": value("tokenizer.chat_template"),
    }


def _repair_tokenizer(folder: Path, facts: dict[str, object]) -> dict[str, object]:
    """tokenizer.json and tokenizer_config.json as the GGUF's metadata says (see the module's docstring)."""
    path = folder / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    by_id = {t["id"]: t["content"] for t in tokenizer["added_tokens"]}
    if facts["add_bos"] is False:
        tokenizer["post_processor"] = {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": True,
        }
    if facts["pre"] == "smollm":  # llama.cpp: "\p{N}" split first, then GPT-2's byte-level regex
        tokenizer["pre_tokenizer"] = {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            ],
        }
    tokenizer["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    path.write_text(json.dumps(tokenizer, ensure_ascii=False, indent=2) + "\n")

    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for dropped in (
        "legacy",
        "model_type",
        "add_prefix_space",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "unk_token_id",
        "use_default_system_prompt",
    ):
        config.pop(dropped, None)
    special = {
        "bos_token": by_id[facts["bos"]],
        "eos_token": by_id[facts["eos"]],
        "pad_token": by_id[facts["pad"]],
        "unk_token": by_id[facts["unk"]],
    }
    config.update(special)
    config.update(
        {
            "add_bos_token": bool(facts["add_bos"]),
            "add_eos_token": False,
            "add_prefix_space": False,
            "tokenizer_class": "GPT2Tokenizer",
            "chat_template": facts["chat_template"],
        }
    )
    config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    (folder / "chat_template.jinja").unlink(missing_ok=True)  # the one template lives in tokenizer_config.json
    return {**special, "ids": {k: facts[k] for k in ("bos", "eos", "pad", "unk")}}


def prepare(gguf: Path, hf_dir: Path) -> dict[str, object]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    special = _repair_tokenizer(hf_dir, _gguf_tokenizer_facts(gguf))
    # The repaired folder must load as the exporters load it, and tokenize as the GGUF does.
    again = AutoTokenizer.from_pretrained(hf_dir)
    assert again.eos_token_id == special["ids"]["eos"] and again.bos_token_id == special["ids"]["bos"], special
    assert again("12 apples")["input_ids"][:2] == again.convert_tokens_to_ids(["1", "2"]), "digits not split"
    return {
        "seconds": round(time.monotonic() - started, 1),
        "special_tokens": special,
        "config": json.loads((hf_dir / "config.json").read_text()),
    }


def export_optimum(hf_dir: Path, out: Path) -> dict[str, object]:
    from optimum.exporters.onnx import main_export

    started = time.monotonic()
    main_export(str(hf_dir), output=str(out), task="text-generation-with-past", device="cpu", do_validation=False)
    return {"seconds": round(time.monotonic() - started, 1)}


def export_builder(hf_dir: Path, out: Path) -> dict[str, object]:
    cache = out.parent / f"{out.name}.builder-cache"
    command = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(hf_dir),
        "-o",
        str(out),
        "-p",
        "fp32",
        "-e",
        "cpu",
        "-c",
        str(cache),
    ]
    started = time.monotonic()
    done = subprocess.run(command, stdout=sys.stderr, stderr=subprocess.STDOUT, env=os.environ)
    shutil.rmtree(cache, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"the builder failed (exit {done.returncode})")
    return {"seconds": round(time.monotonic() - started, 1), "command": " ".join(command[1:])}


def reference(gguf: Path, ids_path: Path, out: Path) -> dict[str, object]:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    ids = json.loads(ids_path.read_text())
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], dtype=torch.int64), use_cache=False).logits
    np.save(out, logits.numpy().astype(np.float32))
    return {"shape": list(logits.shape)}


def main(argv: list[str]) -> int:
    command, *args = argv
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the one JSON line
        result = _run(command, args)
    print(json.dumps(result), flush=True)
    return 0


def _run(command: str, args: list[str]) -> dict[str, object]:
    if command == "prepare":
        result = prepare(Path(args[0]), Path(args[1]))
    elif command == "optimum":
        result = export_optimum(Path(args[0]), Path(args[1]))
    elif command == "builder":
        result = export_builder(Path(args[0]), Path(args[1]))
    elif command == "reference":
        result = reference(Path(args[0]), Path(args[1]), Path(args[2]))
    else:
        raise SystemExit(f"unknown command {command!r}")
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
