"""Peer environments share what their locks pin alike, without the network.

Two locks are split into the layer both see (same name and version) and what
each venv installs itself; the venvs' stamps and the layer's key follow the
locks; and a venv sees a layer's packages through the .pth line, for imports
and for importlib.metadata (which pip reads too).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from testkit import peer_env as pe

EXPORT = """# the exporters
six==1.16.0
idna==3.7
PyYAML==6.0.3
setuptools==80.9.0
optimum==2.1.0  # only here
"""
OLIVE = """six==1.16.0
idna==3.6
pyyaml==6.0.3
setuptools==80.9.0
olive-ai==0.13.0
"""


def test_split_shares_what_both_locks_pin_alike() -> None:
    export = pe.split(EXPORT, [OLIVE])
    assert export.shared == ("PyYAML==6.0.3", "six==1.16.0")  # names compared as pip compares them
    assert export.own == ("idna==3.7", "optimum==2.1.0", "setuptools==80.9.0")  # setuptools: the venv has its own
    olive = pe.split(OLIVE, [EXPORT])
    assert olive.shared == ("pyyaml==6.0.3", "six==1.16.0")
    assert olive.own == ("idna==3.6", "olive-ai==0.13.0", "setuptools==80.9.0")
    assert pe.layer_key(export.shared, "tag") == pe.layer_key(olive.shared, "tag")  # one layer for both
    assert pe.layer_key(export.shared, "tag") != pe.layer_key(export.shared, "other-python")
    assert pe.split(EXPORT, []) == pe.Split((), tuple(sorted(pe.read_pins(EXPORT).values(), key=str.lower)))


def test_a_lock_that_is_not_complete_is_refused() -> None:
    for bad in ("torch>=2\n", "--extra-index-url https://example.org\nsix==1.16.0\n"):
        try:
            pe.read_pins(bad)
        except ValueError as exc:
            assert "complete lock" in str(exc)
        else:
            raise AssertionError(f"accepted {bad!r}")


def _envs(tmp_path: Path) -> tuple[pe.PeerEnv, pe.PeerEnv]:
    (tmp_path / "export.txt").write_text(EXPORT)
    (tmp_path / "olive.txt").write_text(OLIVE)
    export = pe.PeerEnv("export", tmp_path / "export-venv", tmp_path / "export.txt", "", (tmp_path / "olive.txt",))
    olive = pe.PeerEnv("olive", tmp_path / "olive-venv", tmp_path / "olive.txt", "", (tmp_path / "export.txt",))
    return export, olive


def test_the_stamp_follows_the_lock_and_the_layer(tmp_path: Path) -> None:
    export, olive = _envs(tmp_path)
    layers = tmp_path / "layers"
    a, b = pe.plan(export, "tag", layers), pe.plan(olive, "tag", layers)
    assert a.layer == b.layer and a.layer is not None and a.layer.parent == layers
    assert a.stamp["layer"] == a.layer.name and a.stamp["lock_sha256"] != b.stamp["lock_sha256"]
    # The other lock changing what is shared changes this venv's layer, so its stamp, though its own lock did not.
    (tmp_path / "olive.txt").write_text(OLIVE.replace("six==1.16.0", "six==1.17.0"))
    again = pe.plan(export, "tag", layers)
    assert again.stamp["lock_sha256"] == a.stamp["lock_sha256"] and again.layer != a.layer
    assert again.split.shared == ("PyYAML==6.0.3",)
    alone = pe.PeerEnv("kserve", tmp_path / "k", tmp_path / "export.txt")
    assert pe.plan(alone, "tag", layers).layer is None and pe.plan(alone, "tag", layers).stamp["layer"] is None


def test_check_needs_the_stamp_and_a_complete_layer(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    export, _ = _envs(tmp_path)
    monkeypatch.setattr(pe, "LAYERS", tmp_path / "layers")
    built = pe.plan(export)
    assert built.layer is not None
    export.python.parent.mkdir(parents=True)
    export.python.symlink_to(sys.executable)
    assert not pe.check(export)  # no stamp
    (export.venv / pe.STAMP).write_text(json.dumps(built.stamp))
    assert not pe.check(export)  # no layer
    built.layer.mkdir(parents=True)
    assert not pe.check(export)  # a layer without its stamp is half-built
    (built.layer / pe.LAYER_STAMP).write_text(built.layer.name + "\n")
    assert pe.check(export)
    (export.venv / pe.STAMP).write_text(json.dumps({**built.stamp, "lock_sha256": "0" * 64}))
    assert not pe.check(export)


def test_a_venv_sees_its_layer_for_imports_and_metadata(tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    (layer / "sharedpkg").mkdir(parents=True)
    (layer / "sharedpkg" / "__init__.py").write_text("WHERE = 'layer'\n")
    info = layer / "sharedpkg-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sharedpkg\nVersion: 1.2.3\n")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / pe.PTH).write_text(pe.pth_line(layer))
    code = "import importlib.metadata as m, sharedpkg; print(m.version('sharedpkg'), sharedpkg.WHERE)"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=pe.subprocess_env(), cwd="/")
    assert out.stdout.split() == ["1.2.3", "layer"], out.stderr


def test_the_export_and_olive_locks_share_torch_and_its_cuda_libraries() -> None:
    export = pe.split(pe.EXPORT.lock.read_text(), [pe.OLIVE.lock.read_text()])
    names = {pe.canonical(line.split("==")[0]) for line in export.shared}
    assert {"torch", "triton", "nvidia-cublas"} <= names
    own = {pe.canonical(line.split("==")[0]) for line in export.own}
    assert {"transformers", "tokenizers", "huggingface-hub", "optimum"} <= own and "torch" not in own
