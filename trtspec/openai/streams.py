"""How answers leave: server-sent event streams that close what they read when they end
(`ClosingStreamingResponse`, `event_stream`), several choices' Triton responses merged as they
arrive (`merged`), one choice's segments as a Responses or Messages event stream (`segment_events`),
a client that leaves cancelling what it asked for (`unless_gone`), and the model's refusals as
OpenAI errors (`triton_error`)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import StreamingResponse

from trtspec.errors import GENERATION_FAILED, SERVER_BUSY, SHUTTING_DOWN
from trtspec.openai.choice import Choice
from trtspec.openai.protocol import ApiError
from trtspec.openai.segments import Segments, named_sse
from trtspec.openai.triton_stream import TritonError

log = logging.getLogger(__name__)


class ClientGone(Exception):
    """The HTTP client went away before its answer; what it asked for was cancelled."""


async def _watch_disconnect(request: Request, task: asyncio.Future) -> None:
    """Cancel `task` when the HTTP client goes away (the body is read, so only that comes)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            task.cancel()
            return


async def unless_gone(request: Request | None, work: asyncio.Future):
    """`work`'s result, cancelling it if the client goes away first (then ClientGone); None: work
    apart from any request (a background response)."""
    if request is None:
        return await work
    watcher = asyncio.ensure_future(_watch_disconnect(request, work))
    try:
        return await work
    except asyncio.CancelledError:
        if watcher.done():  # it cancelled `work`; a cancellation of this handler goes on up
            raise ClientGone from None
        raise
    finally:
        watcher.cancel()


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that closes its event generator when it ends. Starlette leaves a
    generator whose client went away mid-send suspended at its `yield`: its clean-up (cancelling the
    Triton requests) then waited for garbage collection, which closed it and the generator it reads
    from as two racing tasks ("aclose(): asynchronous generator is already running" in the log)."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


def sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def event_stream(events: AsyncIterator[bytes]) -> ClosingStreamingResponse:
    """A server-sent event stream, closed when its response ends."""
    return ClosingStreamingResponse(events, media_type="text/event-stream",
                                    headers={"Cache-Control": "no-cache"})


# the request parameters whose refusals the model words "the <name> …" or "<name> …" (the
# prediction's tokens are counted by the model, against its context; whether ignore_eos leaves a
# guide an end depends on the model's end ids)
NAMED_BY_THE_MODEL = ("prediction", "ignore_eos")


def triton_error(exc: TritonError, guide: str | None = None) -> ApiError:
    """The model's refusal as an OpenAI error; `guide`: the field that asked for a structured output,
    named where the model names its guided_decoding_guide."""
    message = str(exc)
    if message.startswith(SERVER_BUSY):  # its queue is full: a second later a place may be free
        return ApiError(message, status=503, kind="server_error", code="unavailable", retry_after_s=1)
    if exc.unavailable or message.startswith(SHUTTING_DOWN):  # retry elsewhere
        return ApiError(message, status=503, kind="server_error", code="unavailable")
    if message.startswith(GENERATION_FAILED):  # the model's own failure, not the request's
        return ApiError(message, status=500, kind="server_error", code="internal_error")
    if guide is not None and "guided_decoding_guide" in message:  # the model's name for it
        return ApiError(message.replace("guided_decoding_guide", guide, 1), guide, code="invalid_value")
    param = next((name for name in NAMED_BY_THE_MODEL if message.startswith((f"the {name} ", f"{name} "))),
                 None)
    return ApiError(message, param, code="invalid_value")


async def merged(firsts: list, streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
    """(choice index, step) as the choices' Triton responses arrive, each choice's in order."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, first, steps: AsyncIterator) -> None:
        try:
            await queue.put((i, first))
            if not first.final:
                async for step in steps:
                    await queue.put((i, step))
        except TritonError as exc:
            await queue.put((i, exc))
        finally:
            await queue.put((i, done))

    pairs = enumerate(zip(firsts, streams, strict=True))
    pumps = [asyncio.ensure_future(pump(i, first, steps)) for i, (first, steps) in pairs]
    try:
        left = len(pumps)
        while left:
            i, item = await queue.get()
            if item is done:
                left -= 1
            elif isinstance(item, TritonError):
                raise item
            else:
                yield i, item
    finally:
        for one in pumps:
            one.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)  # each stops reading its stream
        for steps in streams:
            await steps.aclose()  # also when the client went away: cancels the Triton requests


async def segment_events(firsts: list, streams: list[AsyncIterator], run: Choice, segments: Segments,
                         head: Callable[[], list[dict]], tail: Callable[[str], list[dict]],
                         failed: Callable[[str], list[dict]]) -> AsyncIterator[dict]:
    """One choice's segments as an API's events (Responses, Anthropic's Messages): `head`'s, the
    segments' as the text comes, then `tail`'s for the answer's status (completed, or incomplete:
    the limit ran out); a model failing mid-stream ends it with `failed`'s for its message."""
    for event in head():
        yield event
    steps = merged(firsts, streams)
    try:
        async for _, step in steps:
            text = run.take(step)
            segments.scored(run.logprobs_body())
            for event in segments.push(run.deltas(text, step.final)):
                yield event
        status = run.status()
        for event in segments.close(status):
            yield event
        for event in tail(status):
            yield event
    except TritonError as exc:
        for event in segments.close("incomplete") + failed(triton_error(exc).message):
            yield event
    except Exception as exc:  # noqa: BLE001 - a bug: the stream ends with its failure, the server goes on
        log.exception("a %s stream failed", type(segments).__name__)
        for event in segments.close("incomplete") + failed(f"{type(exc).__name__}: {exc}"):
            yield event
    finally:
        await steps.aclose()


async def named_events(events: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    """Events as server-sent events that name their type."""
    try:
        async for event in events:
            yield named_sse(event)
    finally:
        await events.aclose()


def stream_segments(firsts: list, streams: list, run: Choice, segments: Segments, head: Callable,
                    tail: Callable, failed: Callable) -> ClosingStreamingResponse:
    """One choice's segments (`segment_events`) as a server-sent event stream naming each event's type."""
    return event_stream(named_events(segment_events(firsts, streams, run, segments, head, tail, failed)))
