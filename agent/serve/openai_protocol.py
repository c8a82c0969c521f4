"""The OpenAI-compatible requests ``metainfer serve`` takes for a decoder, checked field by field.

Parameters a client may send that this server does not implement (``n`` > 1, ``logprobs``, penalties, tools) are
refused with a 400 naming the field, never silently ignored: a client that asked for two choices and got one would
be misled. Fields OpenAI's clients always send at their defaults pass.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from metainfer.core.engine.decoder.stops import MAX_STOPS

MAX_PROMPT_CHARS = 1 << 20
MAX_MESSAGES = 256
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default for /v1/completions
# Fields accepted only at the value that means "off" (what OpenAI's SDKs send by default).
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "response_format": (None, {"type": "text"}),
}


class RequestError(ValueError):
    """A request that cannot be served as sent: the field and what was expected (an HTTP 400)."""


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    model: str | None = Field(None, max_length=256)
    max_tokens: int | None = Field(None, ge=1, le=1 << 20)
    max_completion_tokens: int | None = Field(None, ge=1, le=1 << 20)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = Field(None, max_length=256)

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences")
        return value

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class CompletionRequest(_Common):
    prompt: str | list[str] = Field(max_length=MAX_PROMPT_CHARS)

    def prompt_text(self) -> str:
        if isinstance(self.prompt, list):
            if len(self.prompt) != 1:
                raise RequestError(f"prompt: one prompt per request (got a list of {len(self.prompt)})")
            return self.prompt[0]
        return self.prompt


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError("messages: only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)


def parse(body: Any, kind: type[_Common]) -> _Common:
    """The checked request, or RequestError with the first field that is wrong."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    for field, neutral in NEUTRAL.items():
        if field in body and body[field] not in neutral:
            raise RequestError(f"{field}: not supported by this server (send it unset, or at {neutral[-1]!r})")
    try:
        request = kind.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise RequestError(f"{where}: {first['msg']}"[:500]) from None
    if isinstance(request, ChatRequest):
        total = sum(len(message.text()) for message in request.messages)
        if total > MAX_PROMPT_CHARS:
            raise RequestError(f"messages: {total} characters in all (limit {MAX_PROMPT_CHARS})")
    return request
