"""Before `make test`: say how much disk the run has, and make room in our own caches when it is short.

A warm run takes about 22 GiB beside ~/.cache/metainfer at its peak (docs/testing.md, "Disk"), a cold one about
35 GiB more for the caches it fills. Short of that, pytest's own capture files fail with ENOSPC partway through a
tier, far from the cause; this says it first, in one line, after evicting the image cache's idle entries.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from hack import cache_budget
from hack.cache_budget import GIB
from hack.controlplane.assets import cache_root
from hack.image import build

WARM_RUN_GIB = 22
COLD_RUN_EXTRA_GIB = 35


def main() -> int:
    cache = cache_root()
    temp = Path(tempfile.gettempdir())
    layers = cache / "image" / "layers"
    if cache_budget.free_bytes(temp) < (WARM_RUN_GIB + 2) * GIB and layers.is_dir():
        build.prune_image_cache(layers, keep=set())
    free = cache_budget.free_bytes(temp) / GIB
    need = WARM_RUN_GIB + (0 if (cache / "image" / "layers").is_dir() else COLD_RUN_EXTRA_GIB)
    where = f"{temp}" + ("" if cache_budget.free_bytes(cache) == cache_budget.free_bytes(temp) else f" and {cache}")
    if free < need:
        print(f"warning: {free:.1f} GiB free under {where}; `make test` takes about {need} GiB at its peak "
              f"(docs/testing.md, Disk): tiers will fail with 'No space left on device'. Free some, or point "
              f"TMPDIR and METAINFER_CACHE at a larger disk.", file=sys.stderr)  # fmt: skip
    else:
        print(f"disk: {free:.1f} GiB free under {where} (a run takes about {need} GiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
