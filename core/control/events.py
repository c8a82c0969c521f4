"""Kubernetes Events the reconcile asks for, and how they are coalesced before posting.

A new policy on a cluster with 20 hardware classes plans 20 "run created"
events in one reconcile; posted one by one they were a third of the operator's
API writes at 100 policies. One Event per (type, reason) and reconcile, listing
what happened, says the same to ``kubectl describe`` for one request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

EventType = Literal["Normal", "Warning"]

# Event messages are free text, but kubectl and dashboards show the first line or so; keep each bounded.
MAX_MESSAGE = 1024


@dataclass(frozen=True)
class Event:
    type: EventType
    reason: str
    message: str


def coalesce(events: Sequence[Event], max_message: int = MAX_MESSAGE) -> list[Event]:
    """One event per (type, reason), in first-seen order; messages joined with '; ', cut at ``max_message``."""
    groups: dict[tuple[EventType, str], list[str]] = {}
    for event in events:
        groups.setdefault((event.type, event.reason), []).append(event.message)
    return [Event(type_, reason, _join(messages, max_message)) for (type_, reason), messages in groups.items()]


def _join(messages: list[str], max_message: int) -> str:
    if len(messages) == 1:
        return messages[0][:max_message]
    budget = max_message - len("; ... and 99999 more")
    text = f"{len(messages)} at once: "
    for shown, message in enumerate(messages):
        piece = ("; " if shown else "") + message
        if len(text) + len(piece) > budget:
            if not shown:  # one long message: show its start rather than nothing
                text += message[: budget - len(text)]
                shown = 1
            return text + f"; ... and {len(messages) - shown} more"
        text += piece
    return text


def missing_agent_account(namespace: str, account: str, run: str) -> str:
    """Why a run's Job will never start a pod: its ServiceAccount is not in the policy's namespace."""
    message = (
        f"run {run}: ServiceAccount {account} does not exist in namespace {namespace}, so the Job's pods are refused "
        f"and the run waits until its deadline; the chart creates it only in its workloadNamespaces: add {namespace} "
        "to the Helm value workloadNamespaces (or create the ServiceAccount and the agent's Role binding)"
    )
    return message[:MAX_MESSAGE]
