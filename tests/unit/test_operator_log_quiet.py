"""The operator's log keeps what a person reads: not kopf's success line for every wake-up of every event."""

from __future__ import annotations

import logging

from metainfer.operator import handlers
from metainfer.operator.main import WAKEUP_HANDLERS, quiet_wakeups


def record(message: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("kopf.objects", level, __file__, 1, message, None, None)


def test_wakeup_successes_are_dropped_and_everything_else_kept() -> None:
    assert not quiet_wakeups(record("Handler 'on_child' succeeded."))
    assert quiet_wakeups(record("Handler 'policy_daemon' succeeded."))
    assert quiet_wakeups(record("Handler 'on_child' failed with an exception and will try again in 60 seconds: x"))
    assert quiet_wakeups(record("created run p-nvidia-a100-1 (NewHardwareClass)"))


def test_the_quieted_handlers_exist() -> None:
    """A renamed handler would quietly bring its lines back: the names must be the handlers' own."""
    for name in WAKEUP_HANDLERS:
        assert callable(getattr(handlers, name)), name
