"""Debian installs go through one door: lists refreshed first, dpkg's lock waited for, failures named."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hack.controlplane import apt


@dataclass
class FakeAptGet:
    """Records each apt-get command; the one whose subcommand is ``failing`` exits 100 as apt does."""

    failing: str | None = None
    commands: list[list[str]] = field(default_factory=list)

    def __call__(self, command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.commands.append(command)
        if self.failing in command:
            return subprocess.CompletedProcess(command, 100, "", "E: Unable to locate package nope")
        return subprocess.CompletedProcess(command, 0, "", "")


@pytest.fixture
def apt_get(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeAptGet:
    fake = FakeAptGet()
    monkeypatch.setattr(apt, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(apt.subprocess, "run", fake)
    return fake


def test_an_install_refreshes_the_lists_first_and_waits_for_dpkgs_lock(apt_get: FakeAptGet) -> None:
    apt.install(["mmdebstrap"])
    assert [c[3] for c in apt_get.commands] == ["update", "install"]
    assert all(c[:3] == ["apt-get", "-o", f"DPkg::Lock::Timeout={apt.DPKG_LOCK_WAIT_S}"] for c in apt_get.commands)
    assert apt_get.commands[1][-1] == "mmdebstrap"


def test_nothing_missing_runs_nothing(apt_get: FakeAptGet) -> None:
    apt.install([])
    assert apt_get.commands == []


def test_a_failed_install_names_its_command_and_what_apt_said(apt_get: FakeAptGet) -> None:
    apt_get.failing = "install"
    with pytest.raises(apt.AptError, match=r"apt-get .* install .* nope failed \(exit 100\):\nE: Unable to locate"):
        apt.install(["nope"])
