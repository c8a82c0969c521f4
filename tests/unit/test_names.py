"""Every Kubernetes name is spelled once, in core.api.names: no other module of core, agent or operator spells one."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from metainfer.core.api import AdaptationPolicy, AdaptationRun, HardwareProfileResource, names

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("core", "agent", "operator")
NAMES_MODULE = REPO / "core" / "api" / "names.py"
# Strings that are nothing but a name of the API: spelled anywhere else, they are a second copy of it.
WHOLE = {
    names.GROUP,
    names.VERSION,
    names.API_VERSION,
    *names.PLURALS,
    names.POLICY_SINGULAR,
    names.RUN_SINGULAR,
    names.PROFILE_SINGULAR,
}
# Any string containing one of these spells (part of) a label, annotation or finalizer key.
PARTS = (names.GROUP, "app.kubernetes.io/")


def _constants() -> dict[str, str]:
    """Each string of core.api.names and the first constant that holds it (GROUP, not KOPF_PREFIX)."""
    out: dict[str, str] = {}
    for name, value in vars(names).items():
        if name.isupper() and isinstance(value, str):
            out.setdefault(value, name)
    return out


CONSTANTS = _constants()


def _documentation(tree: ast.AST) -> set[int]:
    """ids of the string constants that are statements of their own: docstrings, attribute docstrings."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def spelled_names(path: Path, root: Path = REPO) -> list[str]:
    """``FILE:LINE: 'constant' ...`` for each string in ``path`` that spells a Kubernetes name of the API."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _documentation(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docs:
            continue
        text = node.value
        if text not in WHOLE and not any(part in text for part in PARTS):
            continue
        exact = CONSTANTS.get(text)
        within = [name for value, name in CONSTANTS.items() if len(value) > len(names.GROUP) and value in text]
        use = (
            f"use names.{exact}"
            if exact
            else f"build it from names.{', names.'.join(within)}"
            if within
            else "add a constant to core/api/names.py and use it"
        )
        found.append(f"{path.relative_to(root)}:{node.lineno}: {text!r}: {use} (metainfer.core.api.names)")
    return found


def test_no_module_but_names_spells_a_kubernetes_name() -> None:
    files = sorted(p for folder in SCANNED for p in (REPO / folder).rglob("*.py") if p != NAMES_MODULE)
    assert len(files) > 100, "the scan must see the packages' sources"
    spelled = [line for path in files for line in spelled_names(path)]
    assert not spelled, "Kubernetes names spelled outside core/api/names.py:\n" + "\n".join(spelled)


@pytest.mark.parametrize(
    "source, expected",
    [
        ('LABELS = {"metainfer.io/policy": "x"}', "use names.LABEL_POLICY"),
        ('api.list(GROUP, VERSION, "adaptationruns")', "use names.RUN_PLURAL"),
        ('PREFIX = "metainfer.io"', "use names.GROUP"),
        ('KEY = f"metainfer.io/tolerations-{n}"', "build it from names.ANNOTATION_TOLERATIONS"),
        ('LABEL = "app.kubernetes.io/name"', "add a constant"),
    ],
)
def test_the_scan_finds_a_spelled_name_and_says_what_to_use(tmp_path: Path, source: str, expected: str) -> None:
    path = tmp_path / "operator" / "module.py"
    path.parent.mkdir()
    path.write_text(f'"""A docstring may say metainfer.io/policy."""\n\n{source}\n')
    (message,) = spelled_names(path, root=tmp_path)
    assert message.startswith("operator/module.py:3: ") and expected in message


def test_the_literal_types_hold_exactly_their_constants() -> None:
    # A Literal cannot be built from a constant (see names.py): these are the second spellings, checked here.
    assert f"{names.GROUP}/{names.VERSION}" == names.API_VERSION
    assert get_args(names.ApiVersion) == (names.API_VERSION,)
    assert get_args(names.PolicyKind) == (names.POLICY_KIND,)
    assert get_args(names.RunKind) == (names.RUN_KIND,)
    assert get_args(names.ProfileKind) == (names.PROFILE_KIND,)
    for model, kind in [
        (AdaptationPolicy, names.POLICY_KIND),
        (AdaptationRun, names.RUN_KIND),
        (HardwareProfileResource, names.PROFILE_KIND),
    ]:
        version, kind_field = model.model_fields["api_version"], model.model_fields["kind"]
        assert get_args(version.annotation) == (names.API_VERSION,) and version.default == names.API_VERSION
        assert get_args(kind_field.annotation) == (kind,) and kind_field.default == kind


def test_every_metainfer_key_is_in_the_group() -> None:
    keys = [value for value in CONSTANTS if "/" in value and not value.startswith("app.kubernetes.io/")]
    assert keys and all(key.startswith(f"{names.GROUP}/") for key in keys if key != names.API_VERSION), keys
