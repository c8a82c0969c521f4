"""OCR models as pipelines run them, from two exporters with real weights, and text to read.

The ``rapidocr-onnxruntime`` wheel (pinned) carries PaddleOCR's PP-OCRv4 text
detector and text recogniser as paddle2onnx wrote them (opset 12, every spatial
dimension dynamic, HardSwish spelled out as Clip/Div/Mul, HardSigmoid, the
recogniser's SVTR neck with MatMul attention and a 6625-character CTC head).
Both are fetched once with the other trained nets (testkit/cnn_models.py) and held
to their sha256.

The ``ddddocr`` wheel (pinned) carries a captcha and short-text recogniser that
PyTorch 1.9's exporter wrote (opset 12, an EfficientNet-style SiLU backbone, an
LSTM and a CTC head over 8210 characters, seq-major output [steps, 1, classes],
batch fixed at 1); its alphabet is the ``CHARSET_BETA`` list of the wheel's
charsets.py, read as data (never imported), also held to its sha256.

Inputs are rendered, seeded, with Pillow's bundled scalable font, so the models
read real text without any dataset download:

- **lines** (recogniser, 3 x 48 x 320, PaddleOCR's (x/255 - 0.5) / 0.5): invoice
  numbers, dates, amounts and word triples on light paper, dark ink, varying
  size and offset; the ground-truth strings come with them;
- **codes** (ddddocr, 1 x 64 x 192 grey, x/255 as ddddocr feeds it): four to
  six lower-case letters and digits of the kind captchas use, dark on light;
- **pages** (detector, 3 x 416 x 416, ImageNet-normalised): crops of
  scikit-learn's two photographs washed out to paper, with four to eight such
  lines printed on them.

Task quality beside the engine's own metric: for the recogniser, the share of
lines a contender decodes (CTC greedy) exactly as FP32 does, and the share it
reads exactly right (ignoring case for ddddocr, as its users compare); for the
detector, the intersection over union of the text maps binarised at DBNet's 0.3
threshold against FP32's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from testkit.cnn_models import IMAGENET_MEAN, IMAGENET_STD, fetch_wheel_member

WHEEL = "rapidocr-onnxruntime==1.4.4"
DDDDOCR_WHEEL = "ddddocr==1.6.1"
DDDDOCR_CHARSET = ("ddddocr/charsets.py", "ae99cf71e1dd738d50d2c2d2bf8544c16a7d23452e9b64346d3ac4dbff83510f")
CODE_HEIGHT, CODE_WIDTH = 64, 192
CODE_CHARACTERS = "abcdefghijkmnpqrstuvwxyz23456789"  # no 0/o, 1/l: captchas leave out what people misread
LINE_HEIGHT, LINE_WIDTH, PAGE_SIDE = 48, 320, 416  # pages: the photos are 427 px high; DBNet wants x32
DB_THRESHOLD = 0.3  # PaddleOCR's DBNet post-processing binarises the probability map here
WORDS = (
    *("invoice", "total", "amount", "due", "date", "order", "number", "customer", "account", "balance"),
    *("paid", "tax", "net", "gross", "item", "quantity", "price", "unit", "ship", "bill", "reference"),
    *("payment", "discount", "subtotal", "address", "phone", "receipt", "cash", "change", "card"),
)


@dataclass(frozen=True)
class OcrModel:
    name: str
    description: str
    member: str
    sha256: str
    batch: int
    samples: int
    task: str  # "recognise" or "detect"
    wheel: str = WHEEL
    style: str = "ppocr"  # how inputs are rendered and outputs laid out: "ppocr" or "ddddocr"

    def path(self) -> Path:
        return fetch_wheel_member(self.name, self.wheel, self.member, self.sha256)


MODELS = (
    OcrModel(
        "ppocrv4_rec",
        "PP-OCRv4 text recogniser (paddle2onnx, opset 12, SVTR neck, CTC over 6625 characters), trained;"
        " from the rapidocr-onnxruntime 1.4.4 wheel",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        batch=8,
        samples=64,
        task="recognise",
    ),
    OcrModel(
        "ppocrv4_det",
        "PP-OCRv4 text detector (paddle2onnx, opset 12, DBNet on a HardSwish backbone), trained;"
        " from the rapidocr-onnxruntime 1.4.4 wheel",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        batch=1,
        samples=32,
        task="detect",
    ),
    OcrModel(
        "ddddocr_rec",
        "ddddocr's captcha and short-text recogniser (PyTorch 1.9 export, opset 12, SiLU backbone, LSTM, CTC over"
        " 8210 characters), trained; from the ddddocr 1.6.1 wheel",
        "ddddocr/common.onnx",
        "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
        batch=1,
        samples=48,
        task="recognise",
        wheel=DDDDOCR_WHEEL,
        style="ddddocr",
    ),
)


def _text(rng: np.random.Generator) -> str:
    kind = int(rng.integers(0, 4))
    if kind == 0:
        return f"INV-{rng.integers(2019, 2027)}-{rng.integers(0, 99999):05d}"
    if kind == 1:
        return f"{str(rng.choice(WORDS)).title()} {rng.integers(1, 9999)}.{rng.integers(0, 100):02d}"
    if kind == 2:
        return f"{rng.integers(1, 29):02d}/{rng.integers(1, 13):02d}/{rng.integers(2019, 2027)}"
    return " ".join(str(w) for w in rng.choice(WORDS, 3))


def _colour(rng: np.random.Generator, low: int, high: int) -> tuple[int, int, int]:
    r, g, b = (int(v) for v in rng.integers(low, high, 3))
    return r, g, b


def text_lines(samples: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """``samples`` rendered lines, [samples, 3, 48, 320] float32 normalised as PaddleOCR does, and their text."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    images, texts = [], []
    for _ in range(samples):
        text = _text(rng)
        size = int(rng.integers(24, 34))
        image = Image.new("RGB", (LINE_WIDTH, LINE_HEIGHT), _colour(rng, 200, 256))
        top = (LINE_HEIGHT - size) // 2 - 2
        ImageDraw.Draw(image).text(
            (int(rng.integers(2, 12)), top), text, fill=_colour(rng, 0, 80), font=ImageFont.load_default(size=size)
        )
        pixels = np.asarray(image, dtype=np.float32) / 255.0
        images.append(((pixels - 0.5) / 0.5).transpose(2, 0, 1))
        texts.append(text)
    return np.stack(images), texts


def code_lines(samples: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """``samples`` rendered codes, [samples, 1, 64, 192] float32 in 0..1 as ddddocr feeds them, and their text."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    images, texts = [], []
    for _ in range(samples):
        text = "".join(rng.choice(list(CODE_CHARACTERS), int(rng.integers(4, 7))))
        image = Image.new("L", (CODE_WIDTH, CODE_HEIGHT), int(rng.integers(200, 256)))
        font = ImageFont.load_default(size=int(rng.integers(34, 44)))
        ImageDraw.Draw(image).text((int(rng.integers(4, 20)), 8), text, fill=int(rng.integers(0, 80)), font=font)
        images.append((np.asarray(image, dtype=np.float32) / 255.0)[None])
        texts.append(text)
    return np.stack(images), texts


def ddddocr_characters() -> list[str]:
    """ddddocr's CTC alphabet for common.onnx (index 0 is the blank), read from its charsets.py as a literal."""
    import ast

    member, sha256 = DDDDOCR_CHARSET
    source = fetch_wheel_member("ddddocr_charsets", DDDDOCR_WHEEL, member, sha256, suffix=".py").read_text("utf-8")
    for statement in ast.parse(source).body:
        if isinstance(statement, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "CHARSET_BETA" for t in statement.targets
        ):
            charset: list[str] = ast.literal_eval(statement.value)
            return charset
    raise RuntimeError(f"{DDDDOCR_WHEEL}:{member} has no CHARSET_BETA list")


def text_pages(samples: int, seed: int = 0) -> np.ndarray:
    """``samples`` pages of printed lines on washed-out photo crops, [samples, 3, 416, 416] ImageNet-normalised."""
    from PIL import Image, ImageDraw, ImageFont
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    out = np.empty((samples, 3, PAGE_SIDE, PAGE_SIDE), dtype=np.float32)
    for i in range(samples):
        photo = photos[i % len(photos)]
        top = int(rng.integers(0, photo.shape[0] - PAGE_SIDE + 1))
        left = int(rng.integers(0, photo.shape[1] - PAGE_SIDE + 1))
        paper = 0.3 * photo[top : top + PAGE_SIDE, left : left + PAGE_SIDE] + 0.7 * 245.0
        image = Image.fromarray(paper.astype(np.uint8))
        draw = ImageDraw.Draw(image)
        y = int(rng.integers(10, 40))
        for _ in range(int(rng.integers(4, 9))):
            size = int(rng.integers(18, 40))
            if y + size > PAGE_SIDE - 10:
                break
            font = ImageFont.load_default(size=size)
            draw.text((int(rng.integers(5, 120)), y), _text(rng), fill=_colour(rng, 0, 80), font=font)
            y += size + int(rng.integers(8, 40))
        pixels = np.asarray(image, dtype=np.float32) / 255.0
        out[i] = ((pixels - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)).transpose(2, 0, 1)
    return out


def characters(model_path: Path) -> list[str]:
    """The recogniser's CTC alphabet: blank, the dictionary rapidocr stores in the model's metadata, space."""
    model = onnx.load(str(model_path), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    return ["", *meta["character"].splitlines(), " "]


def ctc_read(scores: np.ndarray, alphabet: list[str]) -> list[str]:
    """Greedy CTC decoding of [samples, steps, classes] scores: collapse repeats, drop blanks."""
    lines = []
    for steps in scores.argmax(axis=-1):
        keep = np.concatenate([[True], steps[1:] != steps[:-1]]) & (steps != 0)
        lines.append("".join(alphabet[int(c)] for c in steps[keep]))
    return lines


def map_iou(reference: np.ndarray, other: np.ndarray) -> float:
    """Mean per-image IoU of the text maps binarised at DBNet's threshold (1.0 where both are empty)."""
    ious = []
    for ref, out in zip(reference > DB_THRESHOLD, other > DB_THRESHOLD, strict=True):
        union = np.logical_or(ref, out).sum()
        ious.append(1.0 if union == 0 else float(np.logical_and(ref, out).sum() / union))
    return float(np.mean(ious))


TaskQuality = Callable[[dict[str, np.ndarray]], dict[str, dict[str, float]]]


def inputs_and_task_quality(model: OcrModel) -> tuple[dict[str, np.ndarray], TaskQuality]:
    """The model's feed, and the task metrics of every contender's first output (keyed "ort_fp32" for FP32)."""
    if model.task == "recognise":
        ddddocr = model.style == "ddddocr"
        lines, truth = code_lines(model.samples) if ddddocr else text_lines(model.samples)
        alphabet = ddddocr_characters() if ddddocr else characters(model.path())

        def as_lines(scores: np.ndarray) -> list[str]:
            return ctc_read(scores, alphabet)  # run_all gives [samples, steps, classes] for both styles

        def same(read: str, text: str) -> bool:
            return read.strip().lower() == text.lower() if ddddocr else read.strip() == text

        def read(outputs: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
            fp32 = as_lines(outputs["ort_fp32"])
            result = {}
            for name, scores in outputs.items():
                read_lines = as_lines(scores)
                result[name] = {
                    "same_as_fp32": float(np.mean([a == b for a, b in zip(read_lines, fp32, strict=True)])),
                    "exact": float(np.mean([same(a, t) for a, t in zip(read_lines, truth, strict=True)])),
                }
            return result

        return {"input1" if ddddocr else "x": lines}, read
    pages = text_pages(model.samples)

    def detect(outputs: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
        return {name: {"map_iou": map_iou(outputs["ort_fp32"], maps)} for name, maps in outputs.items()}

    return {"x": pages}, detect
