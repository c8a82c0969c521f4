"""Serving start: how long `metainfer serve` takes from process start to ready, rebuilding the variant vs loading it
from the content-addressed variant store (issue 14, item 6).

The bundled transformer (bert_mini, sequence 128) with the recipe its adaptation picks on this machine
(int8 dynamic, transformer fusion, padding removed): before the store, every serving pod fused and quantized the
model again at start; with it, the pod reads the validated bytes. Each mode is started ``--repeats`` times,
alternating, and timed from the process's start to the first 200 from /v2/health/ready (the readiness probe's
view). No kubelet here: image pull, volume mount and the probe period a real pod adds are not in these numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import benchlib

TITLE = "Serving: pod start, rebuild vs variant store"
RECIPE = {
    "transform": {"quantization": {"mode": "int8_dynamic"}, "fusion": "transformer", "padding": "remove"},
    "batch": 8,
}


def time_to_ready(cmd: list[str], port: int, log: Path) -> float:
    started = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONSAFEPATH": "1"})
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"serve exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as response:
                    if response.status == 200:
                        return time.perf_counter() - started
            except OSError:
                pass
            if time.perf_counter() - started > 300:
                raise SystemExit("serve did not get ready within 300 s")
            time.sleep(0.02)
    finally:
        proc.terminate()
        proc.wait(30)


def render(data: dict[str, Any]) -> str:
    """The section's text from the saved result alone."""
    from metainfer.core.engine.recipe import Recipe

    modes, medians, sha256 = data["seconds_to_ready"], data["median_s"], data["variant_sha256"]
    rows = [
        [mode, len(values), f"{medians[mode]:.2f}", f"{min(values):.2f}", f"{max(values):.2f}"]
        for mode, values in modes.items()
    ]
    return "\n\n".join([
        __doc__.split("\n\n", 1)[1].strip(),
        f"Variant: `{Recipe.model_validate(data['recipe']).describe()}`, {data['variant_bytes'] / 2**20:.1f} MiB (base"
        f" {data['base_bytes'] / 2**20:.1f} MiB); building it in-process takes {data['build_in_process_s']:.2f} s.",
        benchlib.markdown_table(["mode", "starts", "median s", "min s", "max s"], rows),
        f"Loading from the store saves {medians['rebuild'] - medians['store']:.2f} s per pod start"
        f" ({medians['rebuild'] / medians['store']:.2f}x faster to ready). Both modes end with the same bytes:"
        f" the rebuild is checked against sha256 `{sha256[:16]}…` (serve refuses to start otherwise).",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="starts per mode (default 5)")
    parser.add_argument("--quick", action="store_true", help="2 starts per mode")
    args = parser.parse_args(argv)
    repeats = 2 if args.quick else args.repeats

    from hack.controlplane.processes import free_port
    from metainfer.agent import variant_store
    from metainfer.agent.zoo import build_examples
    from metainfer.core.engine.recipe import Recipe
    from metainfer.core.engine.transforms import build_variant

    recipe = Recipe.model_validate(RECIPE)
    with tempfile.TemporaryDirectory(prefix="metainfer-pod-start-") as tmp:
        work = Path(tmp)
        example = build_examples(work / "examples", ["bert_mini"])["bert_mini"]
        base = example.model_path.read_bytes()
        built = time.perf_counter()
        variant = build_variant(base, recipe.transform)
        build_s = time.perf_counter() - built
        sha256, _ = variant_store.put(work / "store", variant)
        modes = {"rebuild": [], "store": []}
        for i in range(repeats):
            for mode in modes:
                port = free_port()
                cmd = [sys.executable, "-m", "metainfer.agent.cli", "serve", "--model-uri", example.model_path.as_uri(),
                       "--model-sha256", example.sha256, "--recipe-json", recipe.model_dump_json(),
                       "--variant-sha256", sha256, "--host", "127.0.0.1", "--port", str(port), "--grpc-port", "0",
                       "--shutdown-delay", "0",  # stopped once ready: nothing routes to it, no need to linger
                       *(["--variant-store", str(work / "store")] if mode == "store" else [])]  # fmt: skip
                log = work / f"{mode}-{i}.log"
                seconds = time_to_ready(cmd, port, log)
                text = log.read_text()
                expect = "loaded from the store" if mode == "store" else "building variant"
                if expect not in text:
                    raise SystemExit(f"{mode}: expected {expect!r} in the log:\n{text[-2000:]}")
                modes[mode].append(seconds)
                print(f"{mode} #{i + 1}: {seconds:.2f} s to ready", flush=True)
    medians = {mode: statistics.median(values) for mode, values in modes.items()}
    data: dict[str, Any] = {
        "model": "bert_mini",
        "recipe": RECIPE,
        "variant_sha256": sha256,
        "variant_bytes": len(variant),
        "base_bytes": len(base),
        "build_in_process_s": build_s,
        "seconds_to_ready": modes,
        "median_s": medians,
    }
    body = render(data)
    digest = hashlib.sha256(variant).hexdigest()
    assert digest == sha256
    benchlib.write_result("pod_start", TITLE, data)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
