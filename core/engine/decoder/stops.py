"""Stop strings over streamed text: what may be sent now, and where the text ends.

A stop string can arrive split across tokens ("\\n\\nUser" as "\\n", "\\nUs", "er"); text that could still be the
start of one is held back until it either completes a stop (the text ends before it, the stop itself is never
sent) or cannot any more (it is sent). OpenAI's API allows up to four stops.
"""

from __future__ import annotations

MAX_STOPS = 4
MAX_STOP_CHARS = 256


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        if len(stops) > MAX_STOPS:
            raise ValueError(f"stop: at most {MAX_STOPS} sequences, got {len(stops)}")
        if any(not stop or len(stop) > MAX_STOP_CHARS for stop in stops):
            raise ValueError(f"stop: every sequence must have 1 to {MAX_STOP_CHARS} characters")
        self.stops = stops
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The text that can be sent now; sets ``stopped`` when a stop string completed (nothing after it is
        returned, ever)."""
        if self.stopped:
            return ""
        self.pending += text
        cut = min((index for stop in self.stops if (index := self.pending.find(stop)) >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self.pending = self.pending[:cut], ""
            return out
        hold = max((k for stop in self.stops for k in range(1, len(stop)) if self.pending.endswith(stop[:k])),
                   default=0)  # fmt: skip
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(self.pending) - hold :]
        return out

    def flush(self) -> str:
        """What was held back, at the end of a generation that no stop string ended."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out
