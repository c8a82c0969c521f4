"""What `make test`'s later tiers download and build on a cold cache, made ahead of them beside the Go builds.

    PYTHONSAFEPATH=1 .venv/bin/python -m hack.prefetch

On a fresh machine `make assets` spends 16 to 44 minutes compiling Go, and then the tiers after it download and
build their inputs one after the other in the lane beside e2e, the longer side of a cold run: the image tier its
base root filesystem and the wheels of four locks, the exports tier the exporters' environments (torch, about
3 GiB) and the exports themselves, the e2e tier the node's Debian packages. `make test` starts this with
`make assets` at the lowest CPU priority (``nice -n 19``: the compilers keep both cores, it gets the gaps and the
network) and raises it to normal once the Go builds are done, so it goes on beside the lane instead of in it. Each
step takes the same lock as the tier that would otherwise do it (apt's, the image build's, the exports'): a tier
that gets there first waits and then finds the work done, and nothing is done twice.

A step that fails is reported and the next one runs: the tier that needs it does it again and fails with its own
error, so prefetching never decides whether `make test` passes. On a warm cache every step is a few file checks.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from hack.controlplane import node as node_mod
from hack.image import build as image_build


@dataclass(frozen=True)
class Step:
    what: str  # what it makes, and (in brackets) the tiers it is for
    run: Callable[[], str]  # does it; returns what it found or made, for the log
    needs_root: bool


def log(message: str) -> None:
    print(f"[prefetch] {message}", flush=True)


def node_packages() -> str:
    missing = node_mod.install_packages()
    return f"installed {', '.join(missing)}" if missing else "all installed already"


def image_inputs() -> str:
    houses = image_build.download_inputs(log)
    return f"base root filesystem and {len(houses)} wheelhouses in the image cache"


def exports() -> str:
    # testkit is the development package beside hack; imported here so a checkout without torch's peers still
    # prefetches the rest.
    from testkit.exports import build_exports

    built = build_exports()
    failed = sorted(name for name, export in built.exports.items() if export.path is None)
    return f"{len(built.exports) - len(failed)} of {len(built.exports)} exports in {built.directory}" + (
        f" (failed: {', '.join(failed)})" if failed else ""
    )


# In the order the tiers after the Go builds need them: e2e starts its node at once; the exports come before the
# image's inputs, whose tier comes right after lint and would wait for them, while the exports tier comes fourth.
STEPS = (
    Step("the node's Debian packages (e2e)", node_packages, needs_root=True),
    Step("the exporters' environments and the exports (exports)", exports, needs_root=False),
    Step("the image's base root filesystem and wheels (image, e2e)", image_inputs, needs_root=True),
)


def main() -> int:
    root = os.geteuid() == 0
    failed = 0
    for step in STEPS:
        if step.needs_root and not root:
            log(f"{step.what}: skipped, needs root (as its tier does)")
            continue
        started = time.monotonic()
        try:
            done = step.run()
        except Exception as exc:  # any failure: the tier that needs the step redoes it and reports its own error
            failed += 1
            log(f"{step.what}: failed after {time.monotonic() - started:.0f}s, left to its tier: {exc}")
            continue
        log(f"{step.what}: {done} ({time.monotonic() - started:.0f}s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
