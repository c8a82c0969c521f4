"""The tokenizer and chat template a decoder carries, read from its metadata and used as untrusted input.

An export directory holds ``tokenizer.json`` and ``tokenizer_config.json`` (special tokens, the Jinja chat
template) beside ``model.onnx``; metainfer ships one file per variant, so ``embed_tokenizer`` copies both into the
model's ``metadata_props`` (``metainfer adapt`` and ``metainfer llm-pack`` do it) and every variant keeps them.
The template comes from whoever made the model: it is rendered in Jinja's immutable sandbox (no attribute access to
Python internals, no mutation), as transformers does, with a bounded output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from metainfer.core.engine.errors import ModelError

# The files' own names: not under "metainfer." (a variant's provenance, which every build rewrites).
TOKENIZER_KEY = "tokenizer.json"
TOKENIZER_CONFIG_KEY = "tokenizer_config.json"
# The context the model was trained for (config.json's max_position_embeddings), where the export says it.
MAX_CONTEXT_KEY = "max_position_embeddings"
CARRIED_KEYS = (TOKENIZER_KEY, TOKENIZER_CONFIG_KEY, MAX_CONTEXT_KEY)
MAX_TEMPLATE_OUTPUT = 1 << 20
REPLACEMENT = "\ufffd"


def embed_tokenizer(
    model: onnx.ModelProto, tokenizer_json: str, tokenizer_config_json: str, max_context: int | None = None
) -> None:
    """Store the tokenizer, its config and the model's context in ``model``'s metadata (replacing any there),
    after checking they parse."""
    _tokenizer_from(tokenizer_json)
    _config_from(tokenizer_config_json)
    kept = [prop for prop in model.metadata_props if prop.key not in CARRIED_KEYS]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    values = {TOKENIZER_KEY: tokenizer_json, TOKENIZER_CONFIG_KEY: tokenizer_config_json}
    if max_context is not None:
        values[MAX_CONTEXT_KEY] = str(max_context)
    for key, value in values.items():
        model.metadata_props.add(key=key, value=value)


def carried_context(metadata: Mapping[str, str]) -> int | None:
    """The context a model's metadata says it was trained for (``metainfer llm-pack`` writes it)."""
    value = metadata.get(MAX_CONTEXT_KEY, "")
    return int(value) if value.isdigit() else None


def carried_tokenizer(metadata: Mapping[str, str]) -> TextCodec | None:
    """The tokenizer a model's metadata carries; None when it carries none."""
    if TOKENIZER_KEY not in metadata:
        return None
    return TextCodec.from_json(metadata[TOKENIZER_KEY], metadata.get(TOKENIZER_CONFIG_KEY, "{}"))


@dataclass
class TextCodec:
    """Text to token ids and back, the stop tokens, and the chat template."""

    tokenizer: Any
    config: dict[str, Any]
    stop_ids: frozenset[int] = field(default_factory=frozenset)
    bos_id: int | None = None

    @classmethod
    def from_json(cls, tokenizer_json: str, config_json: str) -> TextCodec:
        tokenizer = _tokenizer_from(tokenizer_json)
        config = _config_from(config_json)
        stops = {tokenizer.token_to_id(token) for token in _token_texts(config, "eos_token")}
        stops |= {i for i in config.get("stop_token_ids", []) if isinstance(i, int)}  # metainfer llm-pack's
        bos = next(iter(_token_texts(config, "bos_token")), None)
        bos_id = tokenizer.token_to_id(bos) if bos is not None and config.get("add_bos_token") else None
        return cls(tokenizer, config, frozenset(i for i in stops if i is not None), bos_id)

    def encode(self, text: str) -> list[int]:
        ids = list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        return ([self.bos_id] if self.bos_id is not None else []) + ids

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    @property
    def has_chat_template(self) -> bool:
        return isinstance(self.config.get("chat_template"), str)

    def chat_prompt(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt the model's own chat template makes of ``messages``, ending where the assistant speaks."""
        template = self.config.get("chat_template")
        if not isinstance(template, str):
            raise ModelError("tokenizer", "the model carries no chat template (tokenizer_config.json's chat_template)")
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        try:
            rendered = environment.from_string(template).render(
                messages=[dict(message) for message in messages], add_generation_prompt=True,
                bos_token=next(iter(_token_texts(self.config, "bos_token")), ""),
                eos_token=next(iter(_token_texts(self.config, "eos_token")), ""),
            )  # fmt: skip
        except TemplateError as exc:
            raise ModelError("tokenizer", f"the model's chat template failed: {str(exc)[:300]}") from exc
        if len(rendered) > MAX_TEMPLATE_OUTPUT:
            raise ModelError("tokenizer", f"the model's chat template rendered {len(rendered)} characters (limit "
                             f"{MAX_TEMPLATE_OUTPUT})")  # fmt: skip
        return str(rendered)


class StreamingText:
    """Decoded text as tokens arrive: each ``push`` returns the new characters, holding back an incomplete UTF-8
    sequence (decoded as U+FFFD) until the token that completes it."""

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        self.ids: list[int] = []
        self.sent = 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.codec.decode(self.ids)
        if text.endswith(REPLACEMENT):
            return ""
        new, self.sent = text[self.sent :], len(text)
        return new

    def flush(self) -> str:
        """What was held back, at the end: an incomplete sequence then stays U+FFFD, as a whole decode gives."""
        text = self.codec.decode(self.ids)
        new, self.sent = text[self.sent :], len(text)
        return new


def _tokenizer_from(tokenizer_json: str) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # the tokenizers library raises its own untyped exceptions
        raise ModelError("tokenizer", f"the model's tokenizer.json does not load: {str(exc)[:300]}") from exc


def _config_from(config_json: str) -> dict[str, Any]:
    try:
        config = json.loads(config_json)
    except json.JSONDecodeError as exc:
        raise ModelError("tokenizer", f"the model's tokenizer_config.json is not JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelError("tokenizer", "the model's tokenizer_config.json is not a JSON object")
    return config


def _token_texts(config: Mapping[str, Any], key: str) -> list[str]:
    """A special token's text: tokenizer_config.json writes it as a string or as {"content": ...}."""
    value = config.get(key)
    values = value if isinstance(value, list) else [value]
    texts = [v.get("content") if isinstance(v, dict) else v for v in values]
    return [text for text in texts if isinstance(text, str)]
