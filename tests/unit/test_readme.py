"""The README is what a newcomer acts on: every command it shows is run by a test, and `make help` lists every target.

Each shell command in the README's code blocks must be one that ``RUN_BY`` knows, with the tests (or CI's entry
point) that run it; a command no entry matches fails here until a test runs it. The commands too heavy for this tier
(a cluster, an adaptation) are run by the e2e and integration tiers; what this tier can check cheaply it checks here:
`make demo`'s commands parse as the CLI takes them and name the files `metainfer examples build` writes, the README's
request is one the served example decodes and answers, every value the README sets is one the chart has.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from metainfer.agent.cli import build_parser
from metainfer.agent.serve.protocol import (
    Signature,
    TensorSpec,
    datatype_of,
    encode_infer_response,
    parse_infer_request,
)
from metainfer.core.engine.modelinfo import inspect_model

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
# What runs each command the README shows: `path::function` (a test, a fixture or a helper a test calls) or a path
# alone (a script that contains the command). A command matches its pattern whole, spaces collapsed.
RUN_BY: dict[str, tuple[str, ...]] = {
    r"make demo": (
        "tests/unit/test_readme.py::test_make_demo_runs_what_the_cli_accepts_on_the_files_examples_build_writes",
        "tests/integration/test_adapt_real_timing.py::test_cli_writes_the_four_outputs",
    ),
    r"make test": (".ci/run",),
    r"kubectl create namespace team-a": (
        "tests/integration/test_crds_live.py::test_every_example_applies",
        "tests/e2e/platform_harness.py::running_platform",
    ),
    r"helm install metainfer oci://\S+ --version \S+ -n metainfer-system --create-namespace( --set \S+)+": (
        "tests/e2e/platform_harness.py::running_platform",  # from the registry, as here (values in a file)
        # from this checkout's charts/metainfer
        "tests/integration/test_chart_lifecycle.py::test_upgrade_from_the_crds_folder_chart_then_uninstall_keeps_or_deletes_the_crds_as_asked",
        "tests/integration/test_chart_render.py::test_dashboard_is_valid_json_with_the_required_panels",
        "tests/unit/test_readme.py::test_every_value_the_readme_sets_is_one_the_chart_has",
    ),
    r"\.venv/bin/metainfer examples build build/examples": (
        "tests/unit/test_readme.py::test_make_demo_runs_what_the_cli_accepts_on_the_files_examples_build_writes",
        "tests/e2e/test_platform_e2e.py::_adapt_in_the_cuda_image",
    ),
    r"kubectl -n team-a create configmap digits-model --from-file=model\.onnx=build/examples/digits/model\.onnx": (
        "tests/e2e/test_platform_e2e.py::test_every_example_applies_as_it_is_and_a_cpu_example_becomes_ready",
        "tests/unit/test_readme.py::test_make_demo_runs_what_the_cli_accepts_on_the_files_examples_build_writes",
    ),
    r"kubectl apply -f examples/[\w-]+\.yaml": (
        "tests/e2e/test_platform_e2e.py::test_every_example_applies_as_it_is_and_a_cpu_example_becomes_ready",
        "tests/integration/test_crds_live.py::test_every_example_applies",
    ),
    r"kubectl -n team-a get (adaptationpolicies|adaptationruns) -o wide": (
        "tests/integration/test_crds_live.py::test_kubectl_get_shows_the_printer_columns",
    ),
    r"kubectl -n team-a get adaptationpolicy [\w-]+ -o yaml": (
        "tests/e2e/test_platform_e2e.py::test_every_example_applies_as_it_is_and_a_cpu_example_becomes_ready",
        "tests/e2e/test_platform_e2e.py::test_a_policy_is_adapted_by_a_job_on_the_node_and_served_through_its_service",
    ),
    r"curl -s http://\S+/v2/models/[\w-]+/infer .*": (
        "tests/unit/test_readme.py::test_the_readme_request_is_one_the_served_example_decodes_and_answers",
        "tests/e2e/test_platform_e2e.py::test_a_policy_is_adapted_by_a_job_on_the_node_and_served_through_its_service",
    ),
    r"\.venv/bin/metainfer adapt .*": (
        "tests/unit/test_readme.py::test_every_metainfer_command_in_the_readme_parses",
        "tests/integration/test_adapt_real_timing.py::test_cli_writes_the_four_outputs",
    ),
}
# Every fenced block with its info string; those without one (or sh, bash, console) hold shell commands.
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
SHELL = {"", "sh", "bash", "shell", "console"}
EXAMPLE_POLICY = REPO / "examples" / "digits-cpu-policy.yaml"
# How `make help` writes a target: two spaces, its names (aliases after a comma), maybe a variable, the text.
HELP_ROW = re.compile(r"^  ([a-z][\w-]*(?:, [a-z][\w-]*)*)(?: \[[^\]]*\])?\s{2,}\S")


def readme_commands() -> list[str]:
    """The shell commands of the README's code blocks: continuation lines joined, comments and blanks dropped."""
    commands = []
    for info, block in FENCE.findall(README.read_text()):
        if info.strip() not in SHELL:
            continue
        for command in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#\s.*$", "", command)
            command = " ".join(command.split())
            if command:
                commands.append(command)
    return commands


def _runner_exists(where: str) -> bool:
    path, _, name = where.partition("::")
    if not (REPO / path).is_file():
        return False
    return not name or re.search(rf"^\s*def {name}\(", (REPO / path).read_text(), re.MULTILINE) is not None


def _command(prefix: str) -> list[str]:
    (command,) = [c for c in readme_commands() if c.startswith(prefix)]
    return shlex.split(command)


def test_the_readme_shows_commands() -> None:
    commands = readme_commands()
    assert "make demo" in commands and "make test" in commands, commands


def test_every_command_the_readme_shows_is_run_by_a_test() -> None:
    unknown = [c for c in readme_commands() if not any(re.fullmatch(p, c) for p in RUN_BY)]
    assert not unknown, f"README commands no test runs (add the test, then its entry in RUN_BY): {unknown}"


def test_every_runner_named_exists_and_every_entry_is_still_shown() -> None:
    missing = sorted({where for runners in RUN_BY.values() for where in runners if not _runner_exists(where)})
    assert not missing, f"RUN_BY names tests that do not exist: {missing}"
    stale = [p for p in RUN_BY if not any(re.fullmatch(p, c) for c in readme_commands())]
    assert not stale, f"RUN_BY entries the README no longer shows: {stale}"


def test_ci_runs_make_test() -> None:
    lines = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[-1] == "make test", lines


def test_the_readme_stays_short_and_points_at_the_architecture_first() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move detail to a page under docs/"
    assert any("(docs/architecture.md)" in line for line in lines[:15])


def _demo_commands() -> list[list[str]]:
    dry = subprocess.run(["make", "-n", "--no-print-directory", "demo"], cwd=REPO, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    commands = [shlex.split(line) for line in dry.stdout.replace("\\\n", " ").splitlines()]
    return [c for c in commands if c and c[0].endswith("/metainfer")]


def test_make_demo_runs_what_the_cli_accepts_on_the_files_examples_build_writes(examples: dict[str, Path]) -> None:
    """`make demo` (dry run): `metainfer examples build DIR`, then `metainfer adapt` on DIR's digits model and data,
    as the CLI parses them; the README's `examples build` and ConfigMap name the same files."""
    (build, adapt) = _demo_commands()
    parser = build_parser()
    built = parser.parse_args(build[1:])
    args = parser.parse_args(adapt[1:])
    out = Path(built.out)
    written = examples["digits"].parent.parent  # what `metainfer examples build` wrote, in a temporary folder
    for given in (args.model, args.data):
        assert (written / Path(given).relative_to(out)).is_file(), given
    assert _command(".venv/bin/metainfer examples build") == [".venv/bin/metainfer", *build[1:]]
    configmap = _command("kubectl -n team-a create configmap")
    source = configmap[-1].split("=", 2)[-1]
    assert Path(source) == out / "digits" / "model.onnx" and (written / "digits" / "model.onnx").is_file()


def test_every_metainfer_command_in_the_readme_parses() -> None:
    parser = build_parser()
    commands = [shlex.split(c) for c in readme_commands() if c.startswith(".venv/bin/metainfer ")]
    assert any(c[1] == "adapt" for c in commands)
    for command in commands:
        parser.parse_args(command[1:])  # exits 2, naming the flag, on one the CLI does not take


def _signature(model: Path) -> Signature:
    """What `metainfer serve` checks the example's requests against: its inputs and outputs, the batch dynamic."""
    info = inspect_model(model)

    def specs(tensors: Any) -> tuple[TensorSpec, ...]:
        return tuple(
            TensorSpec(t.name, datatype_of(t.dtype), tuple(d if isinstance(d, int) else -1 for d in t.shape))
            for t in tensors
        )

    return Signature(inputs=specs(info.inputs), outputs=specs(info.outputs), max_batch=64)


def test_the_readme_request_is_one_the_served_example_decodes_and_answers(examples: dict[str, Path]) -> None:
    """The README's curl: the policy's Service and model name from the example it applies, a body that the server's
    own decoder takes for the digits model, and the answer the README sketches."""
    policy = yaml.safe_load(EXAMPLE_POLICY.read_text())
    name, namespace = policy["metadata"]["name"], policy["metadata"]["namespace"]
    curl = _command("curl ")
    url = next(word for word in curl if word.startswith("http://"))
    assert url == f"http://{name}.{namespace}.svc:8080/v2/models/{name}/infer", url
    assert curl[curl.index("-H") + 1].lower() == "content-type: application/json"
    (command,) = [c for c in readme_commands() if c.startswith("curl ")]
    quoted = command.split(" -d ", 1)[1]  # the body as the shell reads it: $(seq ...) expanded
    expanded = subprocess.run(["bash", "-c", f"printf '%s' {quoted}"], capture_output=True, text=True, check=True)
    body = expanded.stdout.encode()
    model = examples["digits"]
    request = parse_infer_request(body, None, _signature(model))
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    results = dict(zip(request.outputs, session.run(request.outputs, request.inputs), strict=True))
    answer, header_length = encode_infer_response(name, "1", request, results)
    assert header_length is None  # all JSON, as the README shows it
    (output,) = json.loads(answer)["outputs"]
    assert np.isfinite(output["data"]).all()
    sketch = f'"name": "{output["name"]}", "shape": {output["shape"]}, "datatype": "{output["datatype"]}"'
    assert sketch in " ".join(README.read_text().split()), sketch


def _values_keys(values: Any, prefix: str = "") -> set[str]:
    keys = set()
    if isinstance(values, dict):
        for key, value in values.items():
            keys.add(prefix + key)
            keys |= _values_keys(value, f"{prefix}{key}.")
    return keys


def test_every_value_the_readme_sets_is_one_the_chart_has() -> None:
    """The `--set` keys of its helm command and the values its prose names, and the chart version it installs."""
    chart = _values_keys(yaml.safe_load((REPO / "charts" / "metainfer" / "values.yaml").read_text()))
    helm = [shlex.split(c) for c in readme_commands() if c.startswith("helm ")]
    assert helm
    set_keys = {words[i + 1].split("=", 1)[0] for words in helm for i, w in enumerate(words) if w == "--set"}
    assert "dashboard.enabled" in set_keys
    prose = set(re.findall(r"`((?:agent|serving|workloads|dashboard|image|prometheus)\.[\w.]+)", README.read_text()))
    missing = sorted((set_keys | prose | {"imagePullSecrets"}) - chart)
    assert not missing, f"README sets values the chart does not have: {missing}"
    chart_version = yaml.safe_load((REPO / "charts" / "metainfer" / "Chart.yaml").read_text())["version"]
    versions = {words[words.index("--version") + 1] for words in helm if "--version" in words}
    assert versions == {chart_version}, versions


def _phony() -> set[str]:
    (line,) = [line for line in (REPO / "Makefile").read_text().splitlines() if line.startswith(".PHONY:")]
    return set(line.split(":", 1)[1].split())


def test_make_help_lists_every_target_and_plain_make_still_builds_the_venv() -> None:
    shown = subprocess.run(["make", "--no-print-directory", "help"], cwd=REPO, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    listed = {name for line in shown.stdout.splitlines() if (m := HELP_ROW.match(line)) for name in m[1].split(", ")}
    phony = _phony()
    assert listed == phony, f"not in `make help`: {sorted(phony - listed)}; not targets: {sorted(listed - phony)}"
    goal = subprocess.run(["make", "-pn", "--no-print-directory", "-f", "Makefile", "help"], cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    assert ".DEFAULT_GOAL := .venv/bin/.installed" in goal.stdout


@pytest.mark.parametrize("tier", ["unit", "integration", "test-integration-shared", "test-integration-alone", "e2e",
                                  "image-check", "exports", "test"])  # fmt: skip
def test_make_help_gives_each_tier_its_usual_time(tier: str) -> None:
    shown = subprocess.run(["make", "--no-print-directory", "help"], cwd=REPO, capture_output=True, text=True).stdout
    (row,) = [line for line in shown.splitlines() if (m := HELP_ROW.match(line)) and tier in m[1].split(", ")]
    assert re.search(r"\d+(\.\d+)?(-\d+(\.\d+)?)? min", row), row
