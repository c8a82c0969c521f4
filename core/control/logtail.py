"""The end of a failed pod's log, as a run's status keeps it (status.logTail): untrusted text, bounded."""

from __future__ import annotations

LOG_TAIL_LINES = 20
LOG_TAIL_CHARS = 4000


def log_tail(text: str, lines: int = LOG_TAIL_LINES, limit: int = LOG_TAIL_CHARS) -> str:
    """The end of a pod's log as a run's status keeps it: the last ``lines`` lines, control characters (an ANSI
    colour, a terminal escape a hostile model's error could carry) shown as '?', at most ``limit`` characters
    kept from the end, where the error is."""
    kept = text.rstrip("\n").splitlines()[-lines:]
    clean = "\n".join("".join(ch if ch.isprintable() or ch == "\t" else "?" for ch in line) for line in kept)
    return clean if len(clean) <= limit else "..." + clean[-(limit - 3) :]
