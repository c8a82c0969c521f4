"""The served variant: fetched, verified, rebuilt (or loaded and checked), warmed up.

A serving pod either rebuilds the variant from (base sha256, recipe) — the
recipe is deterministic, so this is the same model the adaptation Job measured
— or loads a prebuilt file whose provenance stamp must name the same base and
transform; serving a variant that is not the one the recipe describes would
make every latency comparison the operator draws from /metrics meaningless.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from metainfer.agent import variant_store
from metainfer.agent.fetch import ConfigMapReader, fetch
from metainfer.agent.serve.deadlines import DeadlineExceeded, Watchdog
from metainfer.agent.serve.protocol import DATATYPES, Signature, TensorSpec, datatype_of
from metainfer.core.api.pod_contract import FLAG_DATA_URI
from metainfer.core.engine.data import Dataset, load_npz
from metainfer.core.engine.decoder.signature import detect, takes_past
from metainfer.core.engine.decoder.stepper import DecoderStepper
from metainfer.core.engine.decoder.tokenizer import TextCodec, carried_context, carried_tokenizer
from metainfer.core.engine.errors import DataError, ModelError
from metainfer.core.engine.index_inputs import IndexBound, index_bounds
from metainfer.core.engine.modelinfo import ModelInfo, TensorInfo, inspect_model, load_model
from metainfer.core.engine.recipe import Recipe, TransformSpec
from metainfer.core.engine.runtime import Session, create_session
from metainfer.core.engine.transforms import build_variant
from metainfer.core.engine.transforms.build import PROVENANCE_PREFIX

log = logging.getLogger("metainfer.serve")
WARMUP_RUNS = 3


@dataclass(frozen=True)
class ModelSourceArgs:
    """Where the base model and calibration data come from (the CLI flags, as one value)."""

    model_uri: str
    model_sha256: str | None
    data_uri: str | None = None
    data_sha256: str | None = None
    calibration_samples: int = 64
    variant_path: Path | None = None
    namespace: str = "default"
    variant_sha256: str | None = None  # what the adaptation validated: loaded or rebuilt, the bytes must match
    variant_store: Path | None = None


@dataclass
class LoadedModel:
    """A ready session (ONNX Runtime or OpenVINO, as the recipe says) and the signature requests are checked
    against."""

    session: Session
    signature: Signature
    base_sha256: str
    variant_sha256: str
    # Whether every output has the batch first, as the dynamic batcher splits it (checked at load: _batch_major).
    batch_major: bool = True
    # A decoder (past key values in, present out) is served as generation: serve/generation.py.
    decoder: Decoder | None = None

    watchdog: Watchdog = field(default_factory=Watchdog)

    def infer(
        self, inputs: dict[str, np.ndarray], outputs: list[str], deadline: float | None = None
    ) -> dict[str, np.ndarray]:
        """Run the session, stopped at ``deadline`` (perf_counter time; raises DeadlineExceeded). ORT releases the
        GIL, so the server calls this from worker threads."""
        options = ort.RunOptions()
        started = time.perf_counter()
        try:
            with self.watchdog.armed(options, deadline):
                values = self.session.run(outputs, inputs, options)
        except Exception:
            if options.terminate:
                raise DeadlineExceeded(time.perf_counter() - started) from None
            raise
        return dict(zip(outputs, values, strict=True))


def load(source: ModelSourceArgs, recipe: Recipe, max_batch: int | None) -> LoadedModel:
    """Fetch, verify, build or check the variant, create the session and warm it up.

    A variant the store holds under the sha256 the run validated is served without fetching the base model: its
    provenance names the base, its inputs and tables are the base's, and a pod under a tight memory limit (what
    weight-only quantization is for) would otherwise hold the FP32 model while it starts: a 134 MiB base took a
    4-bit variant's pod to 549 MiB for a moment, then 167."""
    with tempfile.TemporaryDirectory(prefix="metainfer-serve-") as tmp:
        workdir = Path(tmp)
        stored = _stored_variant(source, recipe)
        if stored is not None:
            variant, info, bounds = stored, *_described(stored, source, workdir)
        else:
            info, base, bounds = fetch_base(source, workdir)
            variant = variant_bytes(source, recipe, info, base, workdir)
            del base
    session = _session(variant, recipe, source)
    signature = _signature(session, info, recipe, max_batch, bounds)
    loaded = LoadedModel(session, signature, info.sha256, _sha256(variant))
    if takes_past(info.inputs):
        loaded.decoder = _decoder(session, variant)
        return loaded
    length = _warm_up(loaded, recipe)
    loaded.batch_major = _batch_major(loaded, length)
    return loaded


@dataclass
class Decoder:
    """What generation needs of a loaded decoder: how to step it, its tokenizer and its context."""

    stepper: DecoderStepper
    codec: TextCodec
    max_context: int | None


def _decoder(session: Session, variant: bytes) -> Decoder:
    """The decoder's stepper and the tokenizer it carries, warmed up by a short generation. A decoder without a
    tokenizer cannot take text: its load fails, naming how to give it one."""
    model = onnx.load_from_string(variant)
    signature = detect(model)
    assert signature is not None, "takes_past said it takes past key values"
    metadata = {prop.key: prop.value for prop in model.metadata_props}
    del model
    codec = carried_tokenizer(metadata)
    if codec is None:
        raise ModelError("model", "the decoder carries no tokenizer (metadata tokenizer.json): pack the export "
                         "directory's tokenizer files into it with `metainfer llm-pack`")  # fmt: skip
    stepper = DecoderStepper(session, signature)
    started = time.perf_counter()
    logits, (cache,) = stepper.step([codec.encode("Hello")[:8] or [0]], [stepper.empty_cache()])
    for _ in range(WARMUP_RUNS):
        logits, (cache,) = stepper.step([[int(np.argmax(logits[0]))]], [cache])
    log.info("decoder warmed up (%d layers, %d KV heads, %s) in %.2fs", len(signature.layers), signature.kv_heads,
             signature.form, time.perf_counter() - started)  # fmt: skip
    return Decoder(stepper, codec, carried_context(metadata))


def _session(variant: bytes, recipe: Recipe, source: ModelSourceArgs) -> Session:
    """The session; on OpenVINO, imported from the compiled blobs the adaptation Job stored when they are valid
    for this variant, these settings and this CPU (the store is read-only here: a miss compiles in memory)."""
    if recipe.session.runtime != "openvino" or source.variant_store is None:
        return create_session(variant, recipe)
    from metainfer.core.engine.runtime_openvino import compiled_cache_key

    started = time.perf_counter()
    cache = variant_store.compiled(source.variant_store, compiled_cache_key(_sha256(variant), recipe))
    session = create_session(variant, recipe, cache)
    how = "imported from the store's compiled cache" if getattr(session, "loaded_from_cache", False) else "compiled"
    log.info("OpenVINO model %s in %.2fs", how, time.perf_counter() - started)
    return session


def fetch_base(source: ModelSourceArgs, workdir: Path) -> tuple[ModelInfo, bytes, dict[str, IndexBound]]:
    """The base model, fetched into ``workdir`` and verified against its sha256, what it takes and gives, and the
    inputs that index its tables (parsed once: a large model's graph is not held twice)."""
    base_path = fetch(
        source.model_uri, workdir / "model.onnx", expected_sha256=source.model_sha256,
        namespace=source.namespace, configmaps=_configmaps(source.model_uri), what="model",
    )  # fmt: skip
    try:
        model = load_model(base_path)
    except ModelError as exc:  # name the URI the operator wrote, not the temp file
        raise ModelError(source.model_uri, exc.problem) from exc
    info = _inspect(base_path, source.model_uri, model)
    bounds = _index_bounds(model)
    del model
    return info, base_path.read_bytes(), bounds


def _stored_variant(source: ModelSourceArgs, recipe: Recipe) -> bytes | None:
    """The store's copy of the variant the run validated, its provenance checked, or None (then it is rebuilt)."""
    expected = source.variant_sha256
    if source.variant_path is not None or expected is None or source.variant_store is None:
        return None
    stored = variant_store.get(source.variant_store, expected)
    if stored is None or source.model_sha256 is None:
        return None
    variant = _checked_variant_bytes(stored, str(source.variant_store), source.model_sha256, recipe.transform)
    log.info("variant %s loaded from the store %s (no rebuild; the base model is not fetched)", expected,
             source.variant_store)  # fmt: skip
    return variant


def _described(variant: bytes, source: ModelSourceArgs, workdir: Path) -> tuple[ModelInfo, dict[str, IndexBound]]:
    """What a stored variant takes and gives (the base's inputs and outputs, under the base's sha256) and the
    inputs that index its tables."""
    path = workdir / "variant.onnx"
    path.write_bytes(variant)
    model = onnx.load_from_string(variant)
    info = _inspect(path, source.model_uri, model)
    return info.model_copy(update={"sha256": source.model_sha256}), _index_bounds(model)


def variant_bytes(source: ModelSourceArgs, recipe: Recipe, info: ModelInfo, base: bytes, workdir: Path) -> bytes:
    """The variant's bytes: the given file, the store's copy, or a rebuild; always the ones the run validated."""
    expected = source.variant_sha256
    if source.variant_path is not None:
        variant = _checked_variant(source.variant_path, info.sha256, recipe.transform)
        what = str(source.variant_path)
    elif (
        expected is not None
        and source.variant_store is not None
        and (stored := variant_store.get(source.variant_store, expected))
    ):
        variant = _checked_variant_bytes(stored, str(source.variant_store), info.sha256, recipe.transform)
        log.info("variant %s loaded from the store %s (no rebuild)", expected, source.variant_store)
        return variant
    else:
        calibration = _calibration(source, recipe, info, workdir)
        log.info("building variant %s (%s)", recipe.transform_key(), recipe.describe())
        variant = build_variant(base, recipe.transform, calibration)
        what = "the rebuilt variant"
    if expected is not None and (actual := _sha256(variant)) != expected:
        raise ModelError(
            what,
            f"has sha256 {actual}, but the adaptation validated {expected}: serving it would make every latency"
            " comparison meaningless. Serve with the image the adaptation Job ran (same onnx and onnxruntime), or"
            " set the policy's serving.variantStore so pods load the validated bytes",
        )
    return variant


def _inspect(path: Path, uri: str, model: onnx.ModelProto | None = None) -> ModelInfo:
    try:
        return inspect_model(path, model)
    except ModelError as exc:  # name the URI the operator wrote, not the temp file
        raise ModelError(uri, exc.problem) from exc


def _calibration(source: ModelSourceArgs, recipe: Recipe, info: ModelInfo, workdir: Path) -> Dataset | None:
    """The samples static int8 calibrates on: the same head of the same NPZ the adaptation Job used."""
    if recipe.transform.quantization.mode != "int8_static":
        return None
    if source.data_uri is None:
        raise DataError(FLAG_DATA_URI, "the recipe is int8_static: its calibration data is needed to rebuild it")
    path = fetch(
        source.data_uri, workdir / "data.npz", expected_sha256=source.data_sha256,
        namespace=source.namespace, configmaps=_configmaps(source.data_uri), what="data",
    )  # fmt: skip
    try:
        return load_npz(path, info).head(source.calibration_samples)
    except DataError as exc:
        raise DataError(exc.field.replace(str(path), source.data_uri), exc.problem) from exc


def _checked_variant(path: Path, base_sha256: str, transform: TransformSpec) -> bytes:
    """A prebuilt variant, accepted only if its provenance names this base model and this transform."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelError(str(path), f"cannot read it ({exc.strerror or exc})") from exc
    return _checked_variant_bytes(data, str(path), base_sha256, transform)


def _checked_variant_bytes(data: bytes, where: str, base_sha256: str, transform: TransformSpec) -> bytes:
    """``data``, accepted only if its provenance names this base model and this transform."""
    try:  # no onnx.checker here: ONNX Runtime is the judge of a variant, and creating the session checks it
        model = onnx.load_from_string(data)
    except Exception as exc:  # protobuf raises several unrelated types
        raise ModelError(where, f"not an ONNX model ({type(exc).__name__}: {exc})") from exc
    props = {p.key: p.value for p in model.metadata_props}
    stamped_base = props.get(f"{PROVENANCE_PREFIX}base_sha256")
    stamped_transform = props.get(f"{PROVENANCE_PREFIX}transform")
    if stamped_base is None or stamped_transform is None:
        raise ModelError(where, "has no metainfer provenance metadata (not built by metainfer?)")
    if stamped_base != base_sha256:
        raise ModelError(where, f"was built from base model {stamped_base}, not {base_sha256}")
    try:
        built_from = TransformSpec.model_validate_json(stamped_transform)
    except ValueError as exc:
        raise ModelError(where, f"has unreadable transform provenance ({exc})") from exc
    if built_from != transform:
        raise ModelError(
            where,
            f"was built with transform {json.loads(stamped_transform)}, the recipe says {transform.model_dump()}",
        )
    return data


def _index_bounds(model: onnx.ModelProto) -> dict[str, IndexBound]:
    """The inputs that index a constant table of the model (a variant keeps the base's inputs and tables)."""
    bounds = index_bounds(model)
    for bound in bounds.values():
        log.info("input %r indexes %r: ids outside [%d, %d] are refused", bound.input, bound.table, -bound.rows,
                 bound.rows - 1)  # fmt: skip
    return bounds


def _signature(
    session: Session, info: ModelInfo, recipe: Recipe, max_batch: int | None, bounds: dict[str, IndexBound]
) -> Signature:
    # Datatypes come from the session (what the variant really takes), shapes from the base model's dims.
    def specs(args: Sequence[Any], tensors: tuple[TensorInfo, ...]) -> tuple[TensorSpec, ...]:
        dims = {t.name: t.shape for t in tensors}
        out = []
        for arg in args:
            shape = dims.get(arg.name, tuple(arg.shape))
            fixed = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)
            out.append(TensorSpec(arg.name, datatype_of(_ORT_TYPES.get(arg.type, arg.type)), fixed))
        return tuple(out)

    inputs = specs(session.get_inputs(), info.inputs)
    fixed_batches = {spec.shape[0] for spec in inputs if spec.shape and spec.shape[0] >= 0}
    allowed = max_batch if max_batch is not None else max(recipe.batch, *fixed_batches, DEFAULT_MAX_BATCH)
    outputs = specs(session.get_outputs(), info.outputs)
    names = {spec.name for spec in inputs}
    return Signature(
        inputs=inputs,
        outputs=outputs,
        max_batch=allowed,
        platform=recipe.session.runtime,
        index_bounds={name: bound for name, bound in bounds.items() if name in names},
    )


DEFAULT_MAX_BATCH = 64
_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int16)": "int16",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
}


def _warm_up(model: LoadedModel, recipe: Recipe) -> int:
    """A few runs at the recipe's batch, so the first real request does not pay for lazy initialisation; returns
    the length its zeros had on dynamic axes other than the batch.

    The inputs' real lengths are unknown here. A length of 1 suits most models, not a convolution without padding
    over a dynamic image (ONNX Runtime: "Invalid input shape": the pod never started), so longer ones are tried.
    A model that runs on none still fails its load: a pod whose model may not run must not become ready."""
    batch = min(recipe.batch, model.signature.max_batch)
    outputs = [spec.name for spec in model.signature.outputs]
    lengths = WARMUP_LENGTHS if _has_dynamic_lengths(model.signature) else WARMUP_LENGTHS[:1]
    failure: Exception | None = None
    for length in lengths:
        feeds = _zeros(model.signature, batch, length)
        try:
            model.infer(feeds, outputs)
        except Exception as exc:  # ONNX Runtime and OpenVINO raise several unrelated types
            failure = exc
            continue
        for _ in range(WARMUP_RUNS - 1):
            model.infer(feeds, outputs)
        log.info("warmed up with %d runs at batch %s (dynamic lengths %d)", WARMUP_RUNS, batch, length)
        return length
    assert failure is not None
    raise WarmUpFailed(f"the model ran on none of the warm-up inputs (zeros, dynamic lengths {list(lengths)}):"
                       f" {str(failure)[:500]}") from failure  # fmt: skip


class WarmUpFailed(RuntimeError):
    """The loaded model did not run on any warm-up input."""


# Lengths tried on dynamic non-batch axes for warm-up: sequences run at 1; images up to a detector's input.
WARMUP_LENGTHS = (1, 32, 224, 640)


def _has_dynamic_lengths(signature: Signature) -> bool:
    return any(d < 0 for spec in signature.inputs for d in spec.shape[1:])


def _batch_major(model: LoadedModel, length: int) -> bool:
    """Whether every output's first axis is the batch, so that a combined run splits back by request.

    A dynamic first axis on every input and output does not say so: a seq-major export declares [steps, batch,
    classes] with both dynamic, and split by rows it would hand each client the steps of every sample. Runs of 1
    and of 2 show it: only the batch's axis follows the number of samples (``length`` on the other dynamic axes:
    the one warm-up ran)."""
    signature = model.signature
    if signature.max_batch < 2 or not signature.dynamic_first_axes:
        return True  # not batched anyway
    names = [spec.name for spec in signature.outputs]
    for batch in (1, 2):
        outputs = model.infer(_zeros(signature, batch, length), names)
        strays = {
            name: list(value.shape) for name, value in outputs.items() if not value.ndim or value.shape[0] != batch
        }
        if strays:
            log.warning("outputs %s of a run of %d do not have the batch first: each request runs alone",
                        str(strays)[:300], batch)  # fmt: skip
            return False
    return True


def _zeros(signature: Signature, batch: int, length: int) -> dict[str, np.ndarray]:
    """Zeros of every input's shape: ``batch`` on a dynamic first axis, ``length`` on any other dynamic axis."""
    feeds: dict[str, np.ndarray] = {}
    for spec in signature.inputs:
        shape = [d if d >= 0 else length for d in spec.shape]
        if shape and spec.shape[0] < 0:
            shape[0] = batch
        feeds[spec.name] = np.zeros(shape, dtype=_numpy(spec.datatype))
    return feeds


def _numpy(datatype: str) -> np.dtype[Any]:
    return DATATYPES[datatype]


def _configmaps(uri: str) -> ConfigMapReader | None:
    """API access only for configmap:// URIs: a serving pod normally has no token, and needs none."""
    if not uri.startswith("configmap://"):
        return None
    from metainfer.agent.job_api import Kube, api_client  # lazily: kubernetes is heavy and rarely needed here

    return Kube(api_client(None))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
