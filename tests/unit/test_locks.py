"""The image's dependency locks (locks/<flavour>.txt) match pyproject.toml, and the image installs only them."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from hack import lock
from hack.image import build, dockerfile

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flavour", lock.FLAVOURS, ids=[f.name for f in lock.FLAVOURS])
def test_each_lock_was_resolved_from_the_current_pyproject(flavour: lock.Flavour) -> None:
    path = REPO / "locks" / f"{flavour.name}.txt"
    assert path.is_file(), f"{path} is missing: run `make lock`"
    recorded = lock.read_header(path.read_text())
    assert recorded["flavour"] == flavour.name
    assert recorded["digest"] == lock.inputs_digest(flavour, lock.project_dependencies()), (
        f"pyproject.toml's dependencies changed since {path.name} was resolved: run `make lock`"
    )


@pytest.mark.parametrize("flavour", lock.FLAVOURS, ids=[f.name for f in lock.FLAVOURS])
def test_every_dependency_is_pinned_with_hashes_within_its_declared_range(flavour: lock.Flavour) -> None:
    pinned = lock.pins((REPO / "locks" / f"{flavour.name}.txt").read_text())
    for declared in lock.flavour_inputs(flavour, lock.project_dependencies()):
        requirement = Requirement(declared)
        name = lock.distribution_name(requirement.name)
        assert name in pinned, f"{declared} (pyproject.toml) is not in locks/{flavour.name}.txt"
        version, hashes = pinned[name]
        assert requirement.specifier.contains(version, prereleases=True), f"{name}=={version} is outside {declared}"
        assert hashes


def test_the_flavours_differ_only_in_their_runtime() -> None:
    cpu = lock.flavour_inputs(lock.FLAVOURS[0], lock.project_dependencies())
    for flavour in lock.FLAVOURS[1:]:
        other = lock.flavour_inputs(flavour, lock.project_dependencies())
        changed = [(a, b) for a, b in zip(cpu, other, strict=True) if a != b]
        assert changed == [(next(d for d in cpu if d.startswith("onnxruntime")), flavour.package)]


def test_a_lock_with_an_unpinned_or_unhashed_entry_is_refused() -> None:
    good = "numpy==2.0.0 \\\n    --hash=sha256:" + "a" * 64 + "\n    # via onnx\n"
    assert lock.pins(good) == {"numpy": ("2.0.0", ["a" * 64])}
    with pytest.raises(lock.LockError, match="not an exact pin"):
        lock.pins("numpy>=2 \\\n    --hash=sha256:" + "a" * 64 + "\n")
    with pytest.raises(lock.LockError, match="no sha256 hash"):
        lock.pins("numpy==2.0.0 \\\n    # via onnx\n")


def test_a_stale_lock_is_reported_by_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "locks").mkdir()
    for flavour in lock.FLAVOURS:
        (tmp_path / "locks" / f"{flavour.name}.txt").write_text((REPO / "locks" / f"{flavour.name}.txt").read_text())
    monkeypatch.setattr(lock, "LOCKS", tmp_path / "locks")
    monkeypatch.setattr(lock, "REPO", tmp_path)
    assert lock.main(["--check"]) == 0
    added = [*lock.project_dependencies(), "left-pad>=1"]
    monkeypatch.setattr(lock, "project_dependencies", lambda: added)
    assert lock.main(["--check"]) == 1


def test_another_onnxruntime_release_replaces_only_its_pin(tmp_path: Path) -> None:
    text = (REPO / "locks" / "cpu.txt").read_text()
    wheel = tmp_path / "onnxruntime-9.9.9-cp311-cp311-manylinux_2_27_x86_64.whl"
    wheel.write_bytes(b"not really a wheel")
    changed = lock.pins(build.lock_with_onnxruntime(text, "9.9.9", wheel))
    original = lock.pins(text)
    assert changed.pop("onnxruntime") == ("9.9.9", [hashlib.sha256(b"not really a wheel").hexdigest()])
    original.pop("onnxruntime")
    assert changed == original


def test_the_dockerfile_installs_the_dependencies_from_the_lock_only_in_a_layer_below_the_project() -> None:
    stage = dockerfile.parse(REPO / "Dockerfile")
    assert (REPO / "locks" / f"{stage.args['RUNTIME']}.txt").is_file()
    installs = [run for run in stage.runs if "pip install" in run.script]
    assert [run.mounts for run in installs] == [("/locks",), ("/dist",)]
    dependencies, project = (run.script for run in installs)
    assert 'pip install --require-hashes --no-deps --only-binary=:all: -r "/locks/${RUNTIME}.txt"' in dependencies
    assert "metainfer" not in dependencies.replace("/var/cache/metainfer", "")  # the project's changes stay above
    assert "pip install --no-deps /dist/metainfer-" in project
    assert "!locks/" in (REPO / ".dockerignore").read_text().splitlines()


def test_a_run_flag_other_than_a_bind_mount_is_refused_by_name(tmp_path: Path) -> None:
    dockerfile_path = tmp_path / "Dockerfile"
    dockerfile_path.write_text("FROM scratch\nRUN --network=none echo hi\n")
    with pytest.raises(dockerfile.DockerfileError, match="--network=none"):
        dockerfile.parse(dockerfile_path)


def test_a_new_commit_changes_only_the_projects_layer_and_a_new_lock_every_layer(tmp_path: Path) -> None:
    """The build cache's keys (hack/image/build.py): the dependencies' layer is keyed by the lock, not the wheel;
    the project's layer by the wheel's files, not its zip timestamps."""
    stage = dockerfile.parse(REPO / "Dockerfile")

    def keys(wheel_text: str, lock_text: str, zip_time: tuple[int, int, int, int, int, int]) -> list[str]:
        dist, locks = tmp_path / "dist", tmp_path / "locks"
        for folder in (dist, locks):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
        with zipfile.ZipFile(dist / "metainfer-0.1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(zipfile.ZipInfo("metainfer/__init__.py", zip_time), wheel_text)
        (locks / "cpu.txt").write_text(lock_text)
        chain, found = "base", []
        for run in stage.runs:
            mounts = build._mount_sources(run, {"/dist": dist, "/locks": locks})
            chain = build._step_key(chain, run, mounts, tmp_path / "wheels" / "0123456789abcdef")
            found.append(chain)
        return found

    first = keys("v = 1", "numpy==2.0.0", (2026, 1, 1, 0, 0, 0))
    assert keys("v = 1", "numpy==2.0.0", (2026, 2, 2, 0, 0, 0)) == first  # the same files, rebuilt later
    commit = keys("v = 2", "numpy==2.0.0", (2026, 1, 1, 0, 0, 0))
    assert commit[0] == first[0] and commit[1:] != first[1:]
    relocked = keys("v = 1", "numpy==2.1.0", (2026, 1, 1, 0, 0, 0))
    assert all(new != old for new, old in zip(relocked, first, strict=True))
