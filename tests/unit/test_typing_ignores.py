"""`make lint` type-checks core, agent and operator strictly; where a line opts out, it says why on that line."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IGNORE = re.compile(r"#\s*type:\s*ignore(\[[^\]]*\])?(?P<rest>.*)$")


def test_every_type_ignore_names_its_code_and_reason() -> None:
    bare = []
    for root in ("core", "agent", "operator"):
        for path in sorted((REPO / root).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                match = IGNORE.search(line)
                if match and (match.group(1) is None or not match.group("rest").strip().startswith("#")):
                    bare.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not bare, "a type: ignore needs its error code and '  # why' on the same line:\n" + "\n".join(bare)
