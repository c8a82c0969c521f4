"""The `go build` command line a GoBinary turns into (no Go run: the steps are recorded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack import prometheus
from hack.controlplane import assets


def _recorded_compile(binary: assets.GoBinary, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("METAINFER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(assets, "find_go", lambda: "go")
    steps: dict[str, list[str]] = {}

    def run_step(step: str, cmd: list[str], *rest: object) -> None:
        steps[step] = cmd
        if step == "compile":
            Path(cmd[cmd.index("-o") + 1]).write_bytes(b"elf")

    monkeypatch.setattr(assets, "_run_step", run_step)
    out = tmp_path / "out"
    out.mkdir()
    assets.build(binary, out, lambda _: None)
    return steps["compile"]


def test_prometheus_is_built_with_kubernetes_discovery_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = prometheus.KUBERNETES_SD_BINARY
    command = _recorded_compile(binary, tmp_path, monkeypatch)
    assert command[command.index("-tags") + 1] == "remove_all_sd,enable_kubernetes_sd"
    assert command[-1] == binary.package == "github.com/prometheus/prometheus/cmd/prometheus"


def test_a_binary_without_tags_gets_no_tags_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = assets.GoBinary("etcd", "go.etcd.io/etcd/server/v3", "v3.7.3", "go.etcd.io/etcd/server/v3")
    assert "-tags" not in _recorded_compile(binary, tmp_path, monkeypatch)


def test_builds_collect_garbage_less_unless_the_caller_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOGC", raising=False)
    assert assets.go_env()["GOGC"] == assets.GO_BUILD_GOGC == "400"
    monkeypatch.setenv("GOGC", "off")
    assert assets.go_env()["GOGC"] == "off"
