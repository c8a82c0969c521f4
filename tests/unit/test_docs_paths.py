"""The docs point at code that exists: every module path and import name they give is a real file or package.

A moved module leaves its old path in the prose, where nothing but a reader trips on it; this test trips first.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("core", "agent", "operator", "hack", "bench", "testkit", "tests", "charts", "crds", "docs", "examples")
# A path under one of the project's top folders, as prose writes it: `core/control/runs.py`, agent/serve/, ...
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(ROOTS)})/[\w./-]*[\w/])")
# An import name of the distribution: metainfer.core.control.reconcile
IMPORT = re.compile(r"(?<![\w.])(metainfer\.(?:core|agent|operator)(?:\.\w+)*)")
# A bare module file named next to its folder (`runs.py`): it must exist somewhere in the package folders.
BARE = re.compile(r"`(\w+\.py)`")
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
# Paths the docs name that are made at run time, not kept in the repository.
GENERATED = ("charts/metainfer/files/crds/", "docs/images/")


def _module_exists(dotted: str) -> bool:
    parts = dotted.split(".")
    folder = {"core": "core", "agent": "agent", "operator": "operator"}[parts[1]]
    base = REPO / folder / Path(*parts[2:])
    if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
        return True
    # metainfer.core.engine.recipe.Recipe: a module followed by a name defined in it.
    module = next((f for f in (base.parent.with_suffix(".py"), base.parent / "__init__.py") if f.is_file()), None)
    if len(parts) <= 3 or module is None:
        return False
    source = module.read_text()
    return re.search(rf"^\s*(?:class |def |async def |\")?{parts[-1]}\b", source, re.MULTILINE) is not None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_and_import_name_in_the_docs_exists(doc: Path) -> None:
    text = doc.read_text()
    missing: list[str] = []
    for match in PATH.finditer(text):
        path = match.group(1).rstrip(".")
        if path.startswith(GENERATED) or "*" in path:
            continue
        if not (REPO / path).exists():
            missing.append(path)
    for match in IMPORT.finditer(text):
        dotted = match.group(1).rstrip(".")
        if not _module_exists(dotted):
            missing.append(dotted)
    assert not missing, f"{doc.relative_to(REPO)} names what does not exist: {sorted(set(missing))}"


def test_bare_module_names_in_the_architecture_page_exist() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    files = {p.name for root in ("core", "agent", "operator") for p in (REPO / root).rglob("*.py")}
    missing = sorted({m.group(1) for m in BARE.finditer(text)} - files)
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


# In docstrings, modules are named by their import path, with or without the `metainfer.` prefix.
DOTTED = re.compile(r"(?<![\w./-])(?:metainfer\.)?((?:core|agent|operator)(?:\.[a-z_][a-z0-9_]*)+)")


def test_every_module_a_docstring_points_to_exists() -> None:
    """Module docstrings say where the rest of a flow lives (core.control.serving, operator.rollout): a rename
    must not leave them pointing nowhere."""
    missing = []
    for root in ("core", "agent", "operator"):
        for path in sorted((REPO / root).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            for match in DOTTED.finditer(doc):
                dotted = match.group(1).rstrip(".")
                if dotted.endswith(".py"):
                    continue
                if not _module_exists(f"metainfer.{dotted}"):
                    missing.append(f"{path.relative_to(REPO)}: {dotted}")
    assert not missing, "module docstrings point at modules that do not exist:\n" + "\n".join(missing)


# -- make targets, policy fields and links the docs name ---------------------------------------------------------
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
# `make lint` in prose; in a code block, a line that starts with `make`. English "make" is neither.
MAKE_IN_PROSE = re.compile(r"`make ([a-z][\w-]*)")
MAKE_IN_CODE = re.compile(r"^\s*make ([a-z][\w-]*)", re.MULTILINE)
MAKE_TARGET = re.compile(r"^([a-zA-Z][\w -]*?):(?!=)", re.MULTILINE)
# spec.slo.latencyP95Ms, status.classes: a field path of one of the project's CRDs.
FIELD = re.compile(r"(?<![\w./$-])((?:spec|status)(?:\.[A-Za-z][A-Za-z0-9]*)+)")
CRDS = [f"metainfer.io_{plural}.yaml" for plural in ("adaptationpolicies", "adaptationruns", "hardwareprofiles")]
# [text](target): a link to a page of the repository, with or without an anchor.
LINK = re.compile(r"\]\(([^)\s]+)\)")


def make_targets() -> set[str]:
    """Every target the Makefile defines (`unit test-unit:` defines two)."""
    return {name for line in MAKE_TARGET.findall((REPO / "Makefile").read_text()) for name in line.split()}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_make_target_the_docs_name_exists(doc: Path) -> None:
    text = doc.read_text()
    named = set(MAKE_IN_PROSE.findall(text))
    named |= {target for block in FENCE.findall(text) for target in MAKE_IN_CODE.findall(block)}
    missing = sorted(named - make_targets())
    assert not missing, f"{doc.relative_to(REPO)} names make targets the Makefile lacks: {missing}"


def _schemas() -> list[dict[str, Any]]:
    schemas = []
    for name in CRDS:
        crd = yaml.safe_load((REPO / "crds" / name).read_text())
        schemas.append(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    return schemas


def _has_field(schema: dict[str, Any], parts: list[str]) -> bool:
    node = schema
    for part in parts:
        while node.get("type") == "array":
            node = node["items"]
        properties = node.get("properties")
        if properties is None:  # a map (labels, resources): any key
            return bool(node.get("additionalProperties") or node.get("x-kubernetes-preserve-unknown-fields"))
        if part not in properties:
            return False
        node = properties[part]
    return True


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_crd_field_the_docs_name_exists(doc: Path) -> None:
    """`spec.searchSpace.runtimes`, `status.classes`: a renamed or moved field must not live on in the prose."""
    schemas = _schemas()
    missing = set()
    for match in FIELD.finditer(doc.read_text()):
        path = match.group(1)
        if path.endswith(".py"):  # status.py, a module
            continue
        if not any(_has_field(schema, path.split(".")) for schema in schemas):
            missing.add(path)
    assert not missing, f"{doc.relative_to(REPO)} names fields no CRD has: {sorted(missing)}"


def anchor_of(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {anchor_of(h) for h in re.findall(r"^#+ (.*)$", text, re.MULTILINE)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_between_the_docs_reaches_its_page_and_heading(doc: Path) -> None:
    """What moved from the README to docs/ is linked by page and heading: a link must land where it says."""
    broken = []
    for target in LINK.findall(FENCE.sub("", doc.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        page = (doc.parent / path).resolve() if path else doc
        if not page.exists() or (anchor and page.suffix == ".md" and anchor not in _anchors(page)):
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)} links to what does not exist: {broken}"
