"""Continuity: what a client of a policy sees while the cluster changes (issue 31), on the real node.

Runs the end-to-end suite (tests/e2e/test_platform_e2e.py), whose continuity scenarios each keep a client loop
going through the policy's Service (one KServe v2 request every 50 ms, a connection per request; see
tests/e2e/client_loop.py) while the node is relabelled to a new hardware class in place (a driver upgrade), a
new model version goes through the canary, the operator is scaled to zero for a minute, and the only serving
pod is deleted and then its Deployment restarted (there with a second client keeping its connection alive). It
renders, per scenario, the requests sent, the failed ones and the longest time without an answer, and the time
from a new class appearing to its first adapted pod Ready.

``--from-timings FILE`` renders the timings a suite run already wrote (METAINFER_E2E_TIMINGS=FILE) instead of
running the suite again. Needs root, like the node.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from bench import benchlib

TITLE = "Continuity: a client's view while hardware, models and the operator change"


def render(data: dict[str, Any]) -> str:
    e = data["e2e"]
    scenarios: dict[str, dict[str, Any]] = e.get("continuity", {})
    rows = [
        (name, r["sent"], f"{r['seconds']:.0f} s", r["failed"], f"{r['longest_gap_s']:.2f} s")
        for name, r in scenarios.items()
    ]
    table = benchlib.markdown_table(
        ["scenario", "requests (one per 50 ms)", "duration", "failed", "longest gap without an answer"], rows
    )

    def seconds(key: str) -> str:
        return f"{e[key]:.0f} s" if key in e else "not measured in this run"

    # Runs before the suite recorded the outcome could only end served on the new image (its test required it).
    upgrade = e.get("chart_upgrade_outcome", "served on the new image")
    timing = [
        ("relabel (new class) to its first provisional pod Ready",
         seconds("new_class_to_first_provisional_pod_ready_s")),
        ("relabel (new class) to its first adapted pod Ready", seconds("new_class_to_first_adapted_pod_ready_s")),
        (f"chart upgrade (another ONNX Runtime) to settled: {upgrade}",
         seconds("chart_upgrade_to_new_runtime_served_s")),
    ]  # fmt: skip
    notes = (
        "One node, 2 CPUs; the client runs on the host and reaches the policy's ClusterIP through kube-proxy, a "
        "new connection per request (the keep-alive client reuses one until the server closes it). A gap is the "
        "longest time between two answers (or from the loop's start or to its stop), so 50 ms plus one request is "
        "the floor. The relabel keeps the old class's pod serving until the new class serves (make-before-break); "
        "the chart upgrade keeps the image that validated the served variant until the class is re-adapted under "
        "the new runtime; the deleted pod, the only one, answers until its replacement is routed. The figures come "
        "from the timings a run of tests/e2e/test_platform_e2e.py writes (METAINFER_E2E_TIMINGS); `python "
        "bench/continuity.py` runs the suite and renders them in one step."
    )
    return (
        table
        + "\n\n"
        + benchlib.markdown_table(["step", "measured"], timing)
        + "\n\n"
        + notes
        + f"\n\nWhole e2e platform suite (wall): {data['e2e_wall_s']:.0f} s."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from-timings", type=Path, help="the timings JSON a suite run wrote")
    parser.add_argument("--wall-s", type=float, help="with --from-timings: that run's wall time, seconds")
    args = parser.parse_args(argv)
    if args.from_timings:
        e2e, wall = json.loads(args.from_timings.read_text()), args.wall_s or 0.0
    else:
        if os.geteuid() != 0:
            print("needs root (the node changes the host)", file=sys.stderr)
            return 2
        from bench.real_node import e2e_timings

        e2e, wall = e2e_timings()
    if not e2e.get("continuity"):
        print("the suite recorded no continuity scenario", file=sys.stderr)
        return 1
    data = {"e2e": e2e, "e2e_wall_s": wall}
    benchlib.write_result("continuity", TITLE, data)
    print(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
