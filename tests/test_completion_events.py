"""The server-sent events of a streamed /v1/completions or /v1/chat/completions, without a server
(`trtspec.openai.routes.completions._events`): the model's responses given as `Step`s, the events
read back as JSON. Each case was a change to the module that the fast tests passed
(scripts/mutants.py); the served tests (test_openai) need a tritonserver."""

from __future__ import annotations

import asyncio
import json

from trtspec.openai.choice import Choice
from trtspec.openai.logprobs import LogprobsBody
from trtspec.openai.routes.completions import _events
from trtspec.openai.triton_stream import Generation, Step
from trtspec.tokenizer import ByteTokenizer


async def _steps(steps: list[Step]):
    for step in steps:
        yield step


def _stream(runs: list[Choice], responses: list[list[Step]], chat: bool, include_usage: bool,
            continuous: bool = False) -> list:
    """The events of `runs` answered by `responses` (a list of steps per choice), each parsed."""
    async def main() -> list[bytes]:
        firsts = [steps[0] for steps in responses]
        streams = [_steps(steps[1:]) for steps in responses]
        return [e async for e in _events(firsts, streams, runs, "cmpl-1", 7, "m", chat, include_usage,
                                         continuous)]

    events = asyncio.run(asyncio.wait_for(main(), 10))
    assert all(e.startswith(b"data: ") and e.endswith(b"\n\n") for e in events)
    assert events[-1] == b"data: [DONE]\n\n"
    return [json.loads(e[len(b"data: "):]) for e in events[:-1]]


def test_a_streamed_completion_sends_text_chunks_and_a_last_chunk_with_usage_so_far():
    """A completion's chunks carry each step's text (a step with neither text nor logprobs sends
    nothing), then a chunk with the finish_reason and empty text; with continuous_usage_stats every
    chunk carries its choice's usage so far, total = prompt + completion tokens."""
    run = Choice(Generation("", 8), [1, 2, 3])
    events = _stream([run], [[Step("ab", [10, 11]), Step("", []),
                              Step("c", [12], finish_reason="length", final=True)]], False, True, True)
    chunks, summary = events[:-1], events[-1]
    assert [c["choices"] for c in chunks] == [
        [{"index": 0, "text": "ab", "logprobs": None, "finish_reason": None}],
        [{"index": 0, "text": "c", "logprobs": None, "finish_reason": None}],
        [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]]
    assert [c["usage"] for c in chunks] == [
        {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n} for n in (2, 3, 3)]
    assert all(c["object"] == "text_completion" and c["id"] == "cmpl-1" and c["model"] == "m" for c in chunks)
    assert "trtspec" in chunks[-1] and "trtspec" not in chunks[0]
    assert summary["choices"] == [] and summary["usage"]["total_tokens"] == 6


def test_a_step_with_logprobs_but_no_text_still_sends_its_logprobs():
    """Text held back (here by a stop sequence it may start) does not hold back its tokens'
    logprobs: the step is sent with empty text."""
    tok = ByteTokenizer()
    run = Choice(Generation("", 8, logprobs=0, stop_words=("xy",)), [65],
                 logprobs=LogprobsBody(tok, chat=False), decode=tok.decode)
    step = Step("x", tok.encode("x"), logprobs=[-0.5], top_ids=[[]], top_logprobs=[[]])
    events = _stream([run], [[step, Step("", [], finish_reason="stop", final=True)]], False, False)
    (first,) = events[0]["choices"]
    assert first["text"] == "" and first["logprobs"]["tokens"] == ["x"]
    assert "usage" not in events[0]


def test_a_streamed_chat_starts_each_choice_with_its_role_and_ends_with_an_empty_delta():
    """Chat: a first chunk per choice with the assistant's role, content deltas, then a chunk with an
    empty delta and the finish_reason; with include_usage (not continuous) each chunk says usage null
    and a last chunk without choices gives the usage."""
    runs = [Choice(Generation("", 8), [1, 2]), Choice(Generation("", 8), [1, 2], sample=1)]
    responses = [[Step("hi", [5, 6], finish_reason="stop", final=True)] for _ in runs]
    events = _stream(runs, responses, True, True)
    by_choice = {i: [e["choices"][0] for e in events if e["choices"] and e["choices"][0]["index"] == i]
                 for i in (0, 1)}
    for choices in by_choice.values():
        assert [(c["delta"], c["finish_reason"]) for c in choices] == [
            ({"role": "assistant", "content": ""}, None), ({"content": "hi"}, None), ({}, "stop")]
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert all(e["usage"] is None for e in events[:-1])
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 4
