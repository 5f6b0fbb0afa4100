"""How answers leave, without a server: the model's refusals as OpenAI errors (`triton_error`), a
client leaving cancelling its work (`unless_gone`), several choices' responses merged as they arrive
(`merged`) and a model failing mid-stream in a Responses event stream (`segment_events`)."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from trtspec.openai.choice import Choice
from trtspec.openai.responses import OutputItems
from trtspec.openai.streams import ClientGone, merged, segment_events, triton_error, unless_gone
from trtspec.openai.triton_stream import Generation, Step, TritonError


def test_a_busy_server_asks_the_client_to_retry_a_second_later():
    error = triton_error(TritonError("the server is busy: its 8 decoder slots are taken and 3 wait already"))
    assert (error.status, error.code, error.retry_after_s) == (503, "unavailable", 1)


def test_an_unreachable_triton_is_a_503_whatever_its_message():
    error = triton_error(TritonError("Triton at 127.0.0.1:1: connection refused", unavailable=True))
    assert (error.status, error.kind, error.code) == (503, "server_error", "unavailable")
    assert error.retry_after_s is None


def test_the_guide_is_named_as_the_request_named_it_once():
    """The model's guided_decoding_guide is the request's field (response_format, ...); only the
    first mention is the guide itself, guided_decoding_guide_type after it stays the model's."""
    message = "guided_decoding_guide must be empty for guided_decoding_guide_type 'json'"
    error = triton_error(TritonError(message), guide="response_format")
    assert error.message == "response_format must be empty for guided_decoding_guide_type 'json'"
    assert (error.param, error.status, error.code) == ("response_format", 400, "invalid_value")
    # no guide asked for: the model's words as they are
    alone = triton_error(TritonError(message))
    assert (alone.message, alone.param) == (message, None)
    # a guide asked for, a refusal not about it: not blamed on the guide
    refusal = "prompt: 5000 tokens exceed the 4096 positions"
    other = triton_error(TritonError(refusal), guide="response_format")
    assert (other.message, other.param) == (refusal, None)


def test_the_parameters_the_model_names_are_the_errors_param():
    assert triton_error(TritonError("the prediction is 9000 tokens, past the context")).param == "prediction"
    assert triton_error(TritonError("ignore_eos leaves the guide no end")).param == "ignore_eos"
    assert triton_error(TritonError("predictions are off")).param is None


def _request(messages: list[dict]) -> Request:
    """A Starlette request whose client sends `messages`, then nothing more (it waits)."""
    queue = list(messages)

    async def receive():
        if queue:
            return queue.pop(0)
        await asyncio.Event().wait()

    return Request({"type": "http", "method": "POST", "headers": []}, receive)


def test_work_of_a_client_that_stays_is_its_result():
    """Body messages before the answer are no disconnect: the work goes on to its result."""
    async def main():
        loop = asyncio.get_running_loop()
        work = loop.create_future()
        loop.call_later(0.05, work.set_result, 42)
        request = _request([{"type": "http.request", "body": b"", "more_body": False}])
        return await asyncio.wait_for(unless_gone(request, work), 2)

    assert asyncio.run(main()) == 42


def test_a_client_that_leaves_cancels_its_work_at_once():
    async def main():
        loop = asyncio.get_running_loop()
        work = loop.create_future()  # never done by itself
        request = _request([{"type": "http.request", "body": b"", "more_body": False},
                            {"type": "http.disconnect"}])
        start = loop.time()
        with pytest.raises(ClientGone):
            await asyncio.wait_for(unless_gone(request, work), 2)
        assert work.cancelled() and loop.time() - start < 1  # by the disconnect, not the timeout

    asyncio.run(main())


def test_work_apart_from_any_request_is_awaited_unwatched():
    async def main():
        work = asyncio.get_running_loop().create_future()
        work.set_result("done")
        return await unless_gone(None, work)

    assert asyncio.run(main()) == "done"


async def _steps(texts: list[str], closed: list, delay: float = 0.0):
    """A choice's later responses (the last final); `closed` notes that its reader closed it."""
    try:
        for i, text in enumerate(texts):
            await asyncio.sleep(delay)
            yield Step(text, [i], final=i == len(texts) - 1)
    finally:
        closed.append(True)


def test_merged_gives_every_choices_steps_each_in_order():
    async def main():
        closed: list = []
        firsts = [Step("a0"), Step("b0")]
        streams = [_steps(["a1", "a2", "a3"], closed, 0.001), _steps(["b1", "b2"], closed, 0.002)]
        got = [(i, step.text) async for i, step in merged(firsts, streams)]
        return got, closed

    got, closed = asyncio.run(asyncio.wait_for(main(), 5))
    assert sorted(got) == [(0, "a0"), (0, "a1"), (0, "a2"), (0, "a3"), (1, "b0"), (1, "b1"), (1, "b2")]
    assert [text for i, text in got if i == 0] == ["a0", "a1", "a2", "a3"]
    assert [text for i, text in got if i == 1] == ["b0", "b1", "b2"]
    assert closed == [True, True]


def test_merged_ends_after_a_single_final_first_response():
    async def main():
        closed: list = []
        return [(i, s.text) async for i, s in merged([Step("all", final=True)], [_steps(["x"], closed)])]

    assert asyncio.run(asyncio.wait_for(main(), 5)) == [(0, "all")]


def test_merged_refuses_choices_without_their_streams():
    async def main():
        async for _ in merged([Step("a"), Step("b")], [_steps(["x"], [])]):
            pass

    with pytest.raises(ValueError):
        asyncio.run(main())


def test_merged_closed_early_closes_every_stream_quietly():
    """A client that leaves mid-answer: closing the merge stops its readers and closes their streams,
    without the readers' cancellation escaping."""
    async def main():
        closed: list = []
        streams = [_steps(["a1", "a2"], closed, 10), _steps(["b1", "b2"], closed, 10)]
        steps = merged([Step("a0"), Step("b0")], streams)
        first = await steps.__anext__()
        await asyncio.sleep(0.01)  # the readers wait inside their streams
        await steps.aclose()
        return first, closed

    first, closed = asyncio.run(asyncio.wait_for(main(), 5))
    assert first == (0, Step("a0")) and closed == [True, True]


def test_a_model_failing_mid_stream_ends_the_response_failed_with_its_message():
    async def failing():
        yield Step("1+", [1])
        raise TritonError("generation failed: CUDA error")

    items = OutputItems()
    run = Choice(Generation(prompt="", max_tokens=8), [])

    async def collect() -> list[dict]:
        head = lambda: [items.event("response.in_progress")]  # noqa: E731
        tail = lambda status: [items.event("response.completed")]  # noqa: E731
        failed = lambda message: [items.event("response.failed", message=message)]  # noqa: E731
        return [e async for e in segment_events([Step("", [])], [failing()], run, items, head, tail, failed)]

    events = asyncio.run(collect())
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-2]["type"] == "response.output_item.done" and events[-2]["item"]["status"] == "incomplete"
    assert (events[-1]["type"], events[-1]["message"]) == ("response.failed", "generation failed: CUDA error")
    assert "response.completed" not in [e["type"] for e in events]
