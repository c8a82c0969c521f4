"""`hack/cluster.py` as `make cluster-up`/`cluster-down` run it, for the tiers that test the CLI itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLUSTER_CLI = Path(__file__).resolve().parents[1] / "hack" / "cluster.py"


def cluster_cli(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CLUSTER_CLI), "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONSAFEPATH": "1", **(env or {})},
    )
