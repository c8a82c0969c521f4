"""The product on the development cluster's real node: set-up, image and the loop's latencies (issue 13).

Measures, on this machine:
- `make cluster-up` with the node (binaries cached): start to node Ready and the default ServiceAccount, and
  `make cluster-down` (every host change undone), ``--repeats`` times;
- the image (`make image`): a cold build (empty image cache: mmdebstrap base, wheelhouse from pip's cache,
  the Dockerfile's RUNs in the chroot, layers), a rebuild as after a new commit (every layer cached but the
  project's), and its layers' sizes;
- then runs the end-to-end suite (tests/e2e/test_platform_e2e.py) and reads the timings it records: helm install
  to operator Ready, kubectl apply to the first serving pod Ready, the Job pod's start to its result, a serving
  pod's start to Ready and how much of that rebuilt the variant, drift onset to the LatencyDrift run and to
  the decision, a model update to the canary pod Ready and to its promotion or rollback.

The cold build of the node's binaries is not repeated here (it needs an empty Go build cache): the CI log of
a fresh machine has it. Needs root, like the node.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import benchlib
from hack.controlplane import assets, launch
from hack.image import build as image_build

TITLE = "Real node: cluster-up, image, apply to Ready, drift to canary"
REPO = Path(__file__).resolve().parents[1]


def cluster_cycles(repeats: int) -> list[dict[str, float]]:
    found = assets.provide(with_node=True)
    cycles = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="metainfer-bench-node-") as tmp:
            started = time.monotonic()
            plane = launch.start(Path(tmp) / "c", found, log=lambda _: None, node=True, die_with_parent=True)
            up = time.monotonic() - started
            started = time.monotonic()
            plane.stop()
            cycles.append({"up_s": up, "down_s": time.monotonic() - started})
    return cycles


def image_builds() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="metainfer-bench-image-") as tmp:
        os.environ["METAINFER_CACHE"] = str(Path(tmp) / "cache")  # an empty image cache: base, wheelhouse, layers
        try:
            cold = image_build.build(log=lambda _: None, out_dir=Path(tmp) / "cold")
            for cached in cold.layer_files[-1:]:  # a new commit: the project's layer is not cached, the rest is
                shutil.rmtree(cached.with_suffix(""))
                cached.unlink()
            commit = image_build.build(log=lambda _: None, out_dir=Path(tmp) / "commit")
            again = image_build.build(log=lambda _: None, out_dir=Path(tmp) / "commit")  # nothing changed
        finally:
            del os.environ["METAINFER_CACHE"]
        return {
            "cold_s": cold.seconds,
            "new_commit_s": commit.seconds,
            "up_to_date_s": again.seconds,
            "archive_mib": cold.size_bytes / 2**20,
            "layers_mib": [size / 2**20 for size in image_build.layer_sizes(cold.archive)],
            "same_digest_cold_and_rebuilt": cold.manifest_digest == commit.manifest_digest,
        }


def e2e_timings() -> tuple[dict[str, Any], float]:
    with tempfile.TemporaryDirectory(prefix="metainfer-bench-e2e-") as tmp:
        out = Path(tmp) / "timings.json"
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/e2e/test_platform_e2e.py"],
            cwd=REPO,
            env={**os.environ, "METAINFER_E2E_TIMINGS": str(out), "PYTHONSAFEPATH": "1"},
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.monotonic() - started
        if result.returncode != 0 or not out.exists():
            raise SystemExit(f"the e2e suite failed; no timings:\n{result.stdout[-4000:]}")
        return dict(json.loads(out.read_text())), wall


def _seconds(e: dict[str, Any], key: str, fmt: str = ".0f") -> str:
    return f"{e[key]:{fmt}} s" if key in e else "not reached (see below)"


def _image_rows(i: dict[str, Any]) -> list[tuple[str, str]]:
    if "new_commit_s" not in i:  # results recorded while the image was one layer
        return [
            ("image, cold (mmdebstrap base + wheelhouse + RUN + layer)", f"{i['cold_s']:.0f} s"),
            ("image, base cached", f"{i['base_cached_s']:.0f} s"),
            ("image, unchanged inputs", f"{i['up_to_date_s']:.0f} s"),
            ("image size (OCI archive / root filesystem layer)",
             f"{i['archive_mib']:.0f} MiB / {i['layer_mib']:.0f} MiB"),
        ]  # fmt: skip
    layers = " / ".join(f"{mib:.1f}" for mib in i["layers_mib"])
    return [
        ("image, cold (mmdebstrap base + wheelhouse + RUNs + layers)", f"{i['cold_s']:.0f} s"),
        ("image, a new commit (every layer cached but the project's)", f"{i['new_commit_s']:.0f} s"),
        ("image, unchanged inputs", f"{i['up_to_date_s']:.0f} s"),
        ("image size: OCI archive, and its layers (base / dependencies / project)",
         f"{i['archive_mib']:.0f} MiB: {layers} MiB"),
    ]  # fmt: skip


def render(data: dict[str, Any]) -> str:
    c, i, e = data["cluster"], data["image"], data["e2e"]
    ups = [x["up_s"] for x in c]
    downs = [x["down_s"] for x in c]
    rows = [
        ("`make cluster-up` with the node, binaries cached (median of runs)", f"{statistics.median(ups):.1f} s "
         f"({min(ups):.1f}-{max(ups):.1f})"),
        ("`make cluster-down` (host changes undone, checked)", f"{statistics.median(downs):.1f} s"),
        *_image_rows(i),
        ("same manifest digest, cold vs rebuilt", "yes" if i["same_digest_cold_and_rebuilt"] else "no"),
        # Results recorded before the cluster had a registry loaded the image with ctr instead.
        ("push to the cluster's registry (image + chart)", f"{e['image_push_s']:.0f} s")
        if "image_push_s" in e
        else ("load into containerd (import + unpack)", f"{e['image_import_s']:.0f} s"),
        ("`helm install` to operator pod Ready", f"{e['helm_install_to_operator_ready_s']:.1f} s"),
        ("`kubectl apply` to first serving pod Ready", f"{e['apply_to_first_serving_pod_ready_s']:.1f} s"),
        ("Job pod start to result (6 trials, digits)", f"{e['job_pod_start_to_result_s']:.0f} s"),
        ("serving pod start to Ready", f"{e['serving_pod_start_to_ready_s']:.0f} s"),
        ("... of which rebuilding the variant (serve's log)", f"{e['serving_variant_build_s'] * 1000:.0f} ms"),
        ("drift: light-load p95 -> saturated p95 (compute, Prometheus)",
         f"{e['drift_light_p95_ms']:.1f} ms -> {e['drift_loaded_p95_ms']:.1f} ms"),
        ("drift onset (load starts) to LatencyDrift run", f"{e['drift_onset_to_run_s']:.0f} s"),
        (f"drift onset to the drift run's outcome ({e.get('drift_decision')})",
         _seconds(e, "drift_onset_to_decision_s")),
        ("model update to canary pod Ready", _seconds(e, "model_update_to_canary_ready_s")),
        ("model update to canary promoted/rolled back (30 s analysis window)",
         _seconds(e, "model_update_to_canary_decision_s")),
        ("whole e2e platform suite (wall)", f"{data['e2e_wall_s']:.0f} s"),
    ]  # fmt: skip
    table = "| step | measured |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)
    notes = (
        "One node, 2 CPUs: the operator (100m), one adaptation Job (1 CPU, Guaranteed) and serving pods (500m; "
        "400m for the drift policy) share it. Seconds from pod timestamps have one-second resolution. The drift "
        "is real: a saturating load makes CFS throttle the CPU-limited serving pods inside ONNX Runtime's runs. "
        "When the LatencyDrift run finds another variant, that variant goes through the canary (the outcome "
        "row says Promoted or RolledBack); when it finds the variant already served (warm-started from the class's "
        "history on the same node and model), nothing is rolled out and the canary rows come from a new model "
        "version instead. "
        "The cold build of kubelet, kube-scheduler and kube-proxy is in the CI log of a fresh machine, not here."
    )
    return table + "\n\n" + notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--render", type=Path, help="only render the raw measurements a run saved (its JSON)")
    args = parser.parse_args(argv)
    if args.render:
        data = json.loads(args.render.read_text())
        benchlib.write_result("real_node", TITLE, data, command="python bench/real_node.py")
        return 0
    if os.geteuid() != 0:
        print("needs root (the node changes the host)", file=sys.stderr)
        return 2
    data: dict[str, Any] = {"cluster": cluster_cycles(args.repeats), "image": image_builds()}
    data["e2e"], data["e2e_wall_s"] = e2e_timings()
    raw = Path(tempfile.gettempdir()) / "metainfer-real-node.json"
    raw.write_text(json.dumps(data, indent=2, default=str))  # kept if rendering fails: the run took minutes
    print(f"raw measurements: {raw}", file=sys.stderr)
    body = render(data)
    benchlib.write_result("real_node", TITLE, data)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
