"""`metainfer serve` flags: the worker count that fits the cores, and the variant flags' checks."""

from __future__ import annotations

import pytest

from metainfer.agent.cli import build_parser
from metainfer.agent.serve import command
from metainfer.agent.serve.command import config_from_args, default_workers
from metainfer.core.control.settings import SHUTDOWN_DELAY_MAX_ENV
from metainfer.core.engine.errors import InputError
from metainfer.core.engine.recipe import Recipe


def _args(*extra: str, recipe: Recipe | None = None):  # type: ignore[no-untyped-def]
    recipe_json = (recipe or Recipe()).model_dump_json()
    return build_parser().parse_args(["serve", "--model-uri", "file:///m.onnx", "--recipe-json", recipe_json, *extra])


@pytest.mark.parametrize(
    ("threads", "cores", "workers"),
    [(0, 2, 1), (2, 2, 1), (1, 2, 2), (2, 8, 4), (3, 8, 2), (4, 2, 1), (0, 16, 1)],
)
def test_concurrent_runs_never_oversubscribe_the_cores(threads: int, cores: int, workers: int) -> None:
    recipe = Recipe.model_validate({"session": {"intra_op_num_threads": threads}})
    assert default_workers(recipe, cores) == workers


def test_workers_default_to_the_cores_and_the_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "usable_cores", lambda: 8)
    two_threads = Recipe.model_validate({"session": {"intra_op_num_threads": 2}})
    assert config_from_args(_args(recipe=two_threads)).workers == 4
    assert config_from_args(_args("--workers", "3", recipe=two_threads)).workers == 3


def test_the_cgroup_quota_bounds_the_usable_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    fingerprint = importlib.import_module("metainfer.core.engine.profile.fingerprint")  # the package exports a function
    monkeypatch.setattr(fingerprint, "affinity_cores", lambda: 2)
    monkeypatch.setattr(fingerprint, "cgroup_cpu_quota", lambda: 1.5)
    assert fingerprint.usable_cores() == 1
    monkeypatch.setattr(fingerprint, "cgroup_cpu_quota", lambda: 0.5)
    assert fingerprint.usable_cores() == 1
    monkeypatch.setattr(fingerprint, "cgroup_cpu_quota", lambda: None)
    assert fingerprint.usable_cores() == 2
    assert fingerprint.detect_machine().logical_cores == 2  # what the search's thread choices come from


@pytest.mark.parametrize(
    ("extra", "flag", "words"),
    [
        (["--variant-sha256", "ABC"], "--variant-sha256", "64 lower-case hex"),
        (["--variant-store", "/tmp"], "--variant-store", "needs --variant-sha256"),
        (["--workers", "0"], "--workers", ">= 1"),
        (["--shutdown-delay", "-1"], "--shutdown-delay", ">= 0"),
        (["--shutdown-delay-max", "-1"], "--shutdown-delay-max", ">= 0"),
    ],
)
def test_flag_mistakes_name_the_flag(extra: list[str], flag: str, words: str) -> None:
    with pytest.raises(InputError, match=flag) as caught:
        config_from_args(_args(*extra))
    assert words in str(caught.value)


def test_the_shutdown_delay_defaults_to_5_s_and_0_turns_it_off() -> None:
    assert config_from_args(_args()).shutdown_delay_s == 5.0
    assert config_from_args(_args("--shutdown-delay", "0")).shutdown_delay_s == 0.0


def test_the_longest_shutdown_delay_comes_from_the_flag_else_the_operators_variable_else_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside the operator (KServe, by hand) the delay is never lengthened unless asked: the pod's grace period
    is Kubernetes' 30 s there. The operator's pods get it as a variable an older serve image ignores."""
    monkeypatch.delenv(SHUTDOWN_DELAY_MAX_ENV, raising=False)
    assert config_from_args(_args()).shutdown_delay_max_s == 0.0
    monkeypatch.setenv(SHUTDOWN_DELAY_MAX_ENV, "30")
    assert config_from_args(_args()).shutdown_delay_max_s == 30.0
    assert config_from_args(_args("--shutdown-delay-max", "90")).shutdown_delay_max_s == 90.0, "the flag wins"
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv(SHUTDOWN_DELAY_MAX_ENV, bad)
        with pytest.raises(InputError, match=SHUTDOWN_DELAY_MAX_ENV):
            config_from_args(_args())
