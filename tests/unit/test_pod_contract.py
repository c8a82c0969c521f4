"""The pod contract is spelled once, in core.api.pod_contract, and both of its sides hold to it: what
core.control.manifests writes into Jobs and Deployments is what ``metainfer``'s parser reads."""

from __future__ import annotations

import argparse
import ast
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from metainfer.agent.cli import build_parser
from metainfer.agent.serve.flags import add_arguments, add_check_arguments
from metainfer.core.api import pod_contract
from metainfer.core.control.hardware import group_nodes
from metainfer.core.control.manifests import build_deployment, build_job, build_run
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, TransformSpec
from metainfer.operator.config import OperatorConfig

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("core", "agent", "operator")
CONTRACT_MODULE = REPO / "core" / "api" / "pod_contract.py"
# Where a contract flag spelled as a whole string is a second copy: the operator's side, and serve's and
# check-provisional's own modules. Elsewhere in agent/ (`metainfer adapt`, `profile`) a flag of the same spelling is
# that command's own.
FLAG_SCOPES = ("core/", "operator/", "agent/serve/")


def _constants() -> dict[str, str]:
    """Each string of core.api.pod_contract and the constant that holds it."""
    out: dict[str, str] = {}
    for name, value in vars(pod_contract).items():
        if name.isupper() and isinstance(value, str):
            assert value not in out, f"{name} and {out.get(value)} spell the same {value!r}"
            out[value] = name
    return out


CONSTANTS = _constants()
ENVS = {value for value, name in CONSTANTS.items() if name.startswith("ENV_")}
FLAGS = {value for value, name in CONSTANTS.items() if name.startswith("FLAG_")}
PATHS = {value for value in CONSTANTS if value.startswith("/")}
# Any string containing one of these spells a path of the pods' own: a new one belongs in the contract.
PATH_PARTS = ("/var/lib/metainfer", "/var/cache/metainfer")
# The operator's own settings (its Deployment's METAINFER_* variables, operator/config.py): another contract.
OPERATOR_SETTINGS = {f"METAINFER_{name.upper()}" for name in OperatorConfig.model_fields}
METAINFER_VARIABLE = re.compile(r"\bMETAINFER_[A-Z0-9_]*[A-Z0-9]")


def _documentation(tree: ast.AST) -> set[int]:
    """ids of the string constants that are statements of their own: docstrings, attribute docstrings."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _use(text: str) -> str:
    return f"use pod_contract.{CONSTANTS[text]}"


def spelled_contract(path: Path, root: Path = REPO) -> list[str]:
    """``FILE:LINE: 'constant': what to do`` for each string in ``path`` that spells part of the pod contract."""
    where = path.relative_to(root).as_posix()
    flags_here = where.startswith(FLAG_SCOPES)
    tree = ast.parse(path.read_text(), str(path))
    docs = _documentation(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docs:
            continue
        text = node.value
        uses = []
        for variable in METAINFER_VARIABLE.findall(text):
            if variable in ENVS:
                uses.append(_use(variable))
            elif variable not in OPERATOR_SETTINGS:
                uses.append(f"{variable}: add a constant to core/api/pod_contract.py and use it")
        if text in ENVS and not text.startswith("METAINFER_"):  # NODE_NAME, POD_NAME
            uses.append(_use(text))
        if flags_here and text in FLAGS:
            uses.append(_use(text))
        uses += [_use(value) for value in PATHS if value in text]
        if not any(value in text for value in PATHS) and any(part in text for part in PATH_PARTS):
            uses.append("add a constant to core/api/pod_contract.py and use it")
        found += [f"{where}:{node.lineno}: {text[:80]!r}: {use} (metainfer.core.api.pod_contract)" for use in uses]
    return found


def test_no_module_but_pod_contract_spells_a_name_of_the_pod_contract() -> None:
    files = sorted(p for folder in SCANNED for p in (REPO / folder).rglob("*.py") if p != CONTRACT_MODULE)
    assert len(files) > 100, "the scan must see the packages' sources"
    spelled = [line for path in files for line in spelled_contract(path)]
    assert not spelled, "pod contract names spelled outside core/api/pod_contract.py:\n" + "\n".join(spelled)


@pytest.mark.parametrize(
    "folder, source, expected",
    [
        ("core/control", 'ENV = [{"name": "METAINFER_POLICY"}]', "use pod_contract.ENV_POLICY"),
        ("agent", 'os.environ.get("NODE_NAME")', "use pod_contract.ENV_NODE_NAME"),
        ("agent", 'raise InputError(f"cap ({n}, METAINFER_MAX_FETCH_BYTES)")', "use pod_contract.ENV_MAX_FETCH_BYTES"),
        ("agent", 'os.environ.get("METAINFER_SOMETHING_NEW")', "METAINFER_SOMETHING_NEW: add a constant"),
        ("core/control", 'args = ["--variant-store", root]', "use pod_contract.FLAG_VARIANT_STORE"),
        ("agent/serve", 'parser.add_argument("--model-uri")', "use pod_contract.FLAG_MODEL_URI"),
        ("operator", 'MOUNT = "/var/lib/metainfer/variants"', "use pod_contract.VARIANT_STORE_MOUNT"),
        ("core/control", 'uri = f"file:///var/lib/metainfer/configmaps/{name}"', "use pod_contract.CONFIGMAP_MOUNT"),
        ("agent", 'default=Path("/dev/termination-log")', "use pod_contract.TERMINATION_MESSAGE_PATH"),
        ("core/control", 'MOUNT = "/var/lib/metainfer/elsewhere"', "add a constant"),
    ],
)
def test_the_scan_finds_a_spelled_name_and_says_what_to_use(
    tmp_path: Path, folder: str, source: str, expected: str
) -> None:
    path = tmp_path / folder / "module.py"
    path.parent.mkdir(parents=True)
    path.write_text(f'"""A docstring may say METAINFER_POLICY, --model-uri and /var/lib/metainfer."""\n\n{source}\n')
    (message,) = spelled_contract(path, root=tmp_path)
    assert message.startswith(f"{folder}/module.py:3: ") and expected in message, message


@pytest.mark.parametrize(
    "folder, source",
    [
        ("agent", 'a.add_argument("--out", type=Path)'),  # `metainfer adapt --out`: adapt's own flag
        ("operator", 'SettingsConfigDict(env_prefix="METAINFER_")'),
        ("core/control", 'raise ValueError("set the Helm value prometheus.url (METAINFER_PROMETHEUS_URL)")'),
        ("agent", 'METAINFER_POLICY = 1  # a comment may say "METAINFER_CLASS"'),
    ],
)
def test_the_scan_lets_other_contracts_and_commands_be(tmp_path: Path, folder: str, source: str) -> None:
    path = tmp_path / folder / "module.py"
    path.parent.mkdir(parents=True)
    path.write_text(f"{source}\n")
    assert spelled_contract(path, root=tmp_path) == []


def test_pod_variables_and_operator_settings_are_apart() -> None:
    """A pod's variable named like one of the operator's settings would read as either in the scan above."""
    assert not ENVS & OPERATOR_SETTINGS
    assert {"METAINFER_AGENT_IMAGE", "METAINFER_SERVING_SHUTDOWN_DELAY_MAX_SECONDS"} <= OPERATOR_SETTINGS


# --- both sides of the command lines --------------------------------------------------------------------------------

GPU = {
    "kubernetes.io/arch": "amd64",
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
    "nvidia.com/cuda.driver-version.full": "550.54.15",
}


def _policy(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"uri": "https://models.example.com/digits.onnx", "sha256": "a" * 64, "version": "1"},
        "slo": {"latencyP95Ms": 10, "batchSize": 1},
        "search": {"timeBudgetSeconds": 600, "backoffLimit": 3},
    }
    return {
        "apiVersion": "metainfer.io/v1alpha1",
        "kind": "AdaptationPolicy",
        "metadata": {"name": "digits", "namespace": "team-a", "uid": "uid-policy", "generation": 3},
        "spec": {**base, **spec},
    }


def _succeeded(run: dict[str, Any], mode: str) -> dict[str, Any]:
    recipe = Recipe(transform=TransformSpec(quantization=QuantizationSpec(mode=mode)))
    return {
        **run,
        "metadata": {**run["metadata"], "uid": "uid-run"},
        "status": {
            "phase": "Succeeded",
            "bestRecipe": recipe.model_dump(mode="json"),
            "bestRecipeKey": recipe.key(),
            "bestVariantSha256": "c" * 64,
            "completionTime": "2026-01-01T00:10:00Z",
        },
    }


def _command_lines() -> tuple[list[str], list[list[str]]]:
    """The Job's command, and the argv (after PROGRAM) of every serving container the operator writes: plain and
    provisional, with every optional flag the policy can ask for."""
    group = next(iter(group_nodes([("gpu-1", GPU)]).values()))
    policy = _policy(
        model={
            "uri": "configmap://digits-model/model.onnx",
            "sha256": "a" * 64,
            "data": {"uri": "s3://data/d.npz", "sha256": "d" * 64},
        },
        slo={"latencyP95Ms": 12.5, "maxQualityDrop": 0.02, "qualityMetric": "argmax_agreement"},
        serving={"variantStore": {"claimName": "variants"}, "maxQueueDelayMs": 5, "batchDependent": "isolate"},
    )
    run = build_run(policy, group, "NewHardwareClass")
    job = build_job(run, group)["spec"]["template"]["spec"]["containers"][0]["command"]
    argvs = []
    for mode in ("int8_dynamic", "int8_static"):
        for provisional in (False, True):
            pod = build_deployment(policy, group, _succeeded(run, mode), provisional=provisional)
            spec = pod["spec"]["template"]["spec"]
            for container in [*spec.get("initContainers", []), *spec["containers"]]:
                assert container["command"] == [pod_contract.PROGRAM]
                argvs.append(container["args"])
    return job, argvs


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(argv: list[str]) -> list[str]:
    return [arg for arg in argv if arg.startswith("--")]


def test_program_is_the_console_script() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[pod_contract.PROGRAM] == "metainfer.agent.cli:main"


def test_the_jobs_command_line_is_the_agents_run_command() -> None:
    job, _ = _command_lines()
    assert job[:3] == [pod_contract.PROGRAM, pod_contract.AGENT_COMMAND, pod_contract.AGENT_RUN_COMMAND]
    args = build_parser().parse_args(job[1:])
    assert (args.command, args.agent_command, args.run) == (*job[1:3], job[3])


def test_every_flag_the_operator_writes_is_one_the_command_declares_and_one_of_the_contract() -> None:
    """Each option is looked up exactly (argparse would also take an abbreviation of a renamed flag), and every
    argv parses; the flags written are exactly the contract's, so the contract names no flag nobody writes."""
    commands = _subparsers(build_parser())
    written: set[str] = set()
    for argv in _command_lines()[1]:
        command, options = argv[0], _options(argv)
        assert command in (pod_contract.SERVE_COMMAND, pod_contract.CHECK_PROVISIONAL_COMMAND)
        parser = commands[command]
        assert set(options) <= set(parser._option_string_actions), (command, options)
        parser.parse_args(argv[1:])
        written |= set(options)
    assert written == FLAGS


def test_the_flag_functions_declare_what_the_cli_does() -> None:
    """agent/serve/flags.py is where both commands' flags are declared; the CLI's subparsers are built from it."""
    commands = _subparsers(build_parser())
    for add, command in (
        (add_arguments, pod_contract.SERVE_COMMAND),
        (add_check_arguments, pod_contract.CHECK_PROVISIONAL_COMMAND),
    ):
        alone = argparse.ArgumentParser()
        add(alone)
        declared = set(alone._option_string_actions) - {"-h", "--help"}
        assert declared == set(commands[command]._option_string_actions) - {"-h", "--help"}


def test_serves_defaults_are_the_ports_and_paths_of_the_contract() -> None:
    commands = _subparsers(build_parser())
    served = commands[pod_contract.SERVE_COMMAND].parse_args(["--model-uri", "m", "--recipe-json", "{}"])
    assert (served.port, served.grpc_port) == (pod_contract.HTTP_PORT, pod_contract.GRPC_PORT)
    check = commands[pod_contract.CHECK_PROVISIONAL_COMMAND]
    checked = check.parse_args(
        ["--model-uri", "m", "--recipe-json", "{}", "--max-quality-drop", "0.1", "--latency-p95-ms", "1", "--out", "o"]
    )
    assert str(checked.message_file) == pod_contract.TERMINATION_MESSAGE_PATH
