"""Stop strings over streamed text, and the OpenAI-compatible request checks of a decoder's serving."""

import pytest

from metainfer.agent.serve.openai_protocol import ChatRequest, CompletionRequest, RequestError, parse
from metainfer.core.engine.decoder.stops import StopMatcher


def test_a_stop_split_across_tokens_is_held_back_then_cut() -> None:
    matcher = StopMatcher(["\n\nUser"])
    sent = [matcher.feed(piece) for piece in ("Hi", " there", "\n", "\nUs", "er: more")]
    assert "".join(sent) == "Hi there" and matcher.stopped
    assert matcher.feed("after") == "" and matcher.flush() == ""


def test_text_that_stops_looking_like_a_stop_is_sent_and_the_rest_flushed() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.feed("the EN") == "the "
    assert matcher.feed("D") == "" and matcher.stopped
    other = StopMatcher(["END"])
    assert other.feed("bE") == "b" and other.feed("x") == "Ex" and other.feed("EN") == ""
    assert other.flush() == "EN" and not other.stopped


def test_the_earliest_of_several_stops_wins() -> None:
    matcher = StopMatcher(["b", "a"])
    assert matcher.feed("xxab") == "xx"


@pytest.mark.parametrize("stops", [["a"] * 5, [""], ["x" * 300]])
def test_bad_stops_are_refused(stops: list[str]) -> None:
    with pytest.raises(ValueError, match="stop"):
        StopMatcher(stops)


def test_a_completion_request_with_openai_sdk_defaults_parses() -> None:
    body = {"model": "m", "prompt": ["hi"], "n": 1, "logprobs": None, "presence_penalty": 0, "stream": True,
            "stream_options": {"include_usage": True}, "seed": 2**63}  # fmt: skip
    request = parse(body, CompletionRequest)
    assert isinstance(request, CompletionRequest)
    assert request.prompt_text() == "hi" and request.include_usage() and request.token_limit() is None


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"prompt": ["a", "b"]}, "one prompt per request"),
        ({"prompt": "a", "frequency_penalty": 0.5}, "frequency_penalty: not supported"),
        ({"prompt": "a", "top_p": 0}, "top_p"),
        ({"prompt": 5}, "prompt"),
        ({}, "prompt"),
    ],
)
def test_a_completion_request_that_cannot_be_served_names_its_field(body: dict[str, object], words: str) -> None:
    with pytest.raises(RequestError, match=words):
        request = parse(body, CompletionRequest)
        assert isinstance(request, CompletionRequest)
        request.prompt_text()


def test_chat_messages_take_text_parts_and_refuse_images() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    request = parse({"messages": [{"role": "user", "content": parts}]}, ChatRequest)
    assert isinstance(request, ChatRequest) and request.messages[0].text() == "ab"
    with pytest.raises(RequestError, match="only text"):
        parse({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, ChatRequest)
    with pytest.raises(RequestError, match=r"messages\.0\.role"):
        parse({"messages": [{"role": "wizard", "content": "x"}]}, ChatRequest)
