"""OpenAI's `/v1/completions` and `/v1/chat/completions`: a choice per prompt and sample, answered
whole or as server-sent events (`data: {chunk}` per decode step, the first chat chunk carrying the
role, a chunk with `finish_reason`, a usage chunk when `stream_options.include_usage`, then
`data: [DONE]`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request

from trtspec.openai.choice import Choice, figures_of, usage_of
from trtspec.openai.frontend import Frontend
from trtspec.openai.protocol import ChatRequest, CompletionRequest, check_chat, check_completion, parse
from trtspec.openai.streams import event_stream, merged, sse, triton_error
from trtspec.openai.tools import ToolPlan, check_tools, merge_deltas
from trtspec.openai.triton_stream import TritonError

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def add_routes(app: FastAPI, front: Frontend) -> None:
    model = front.model

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = parse(CompletionRequest, await front.body(request))
        front.check_model(req.model)
        prompts = check_completion(req, model.vocab_size)
        return await respond(request, req, prompts, False, COMPLETION_DEFAULT_MAX_TOKENS)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = parse(ChatRequest, await front.body(request))
        front.check_model(req.model)
        messages = check_chat(req, model.vocab_size)
        tools = check_tools(req, model.tool_parser)
        prompt, start = front.chat_prompt(req, messages, tools)
        return await respond(request, req, [prompt], True, None, tools, start)

    async def respond(request: Request, req, prompts: list[str | list[int]], chat: bool,
                      default_max: int | None, tools: ToolPlan | None = None, start: str | None = None):
        runs = front.choices_of(req, prompts, chat, default_max, tools, start)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        guide = front.guide_param(req, tools)
        if not req.stream:
            return await _whole(request, front, runs, rid, created, chat, guide)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous = include_usage and req.stream_options.continuous_usage_stats
        firsts, streams = await front.started(request, runs, guide)
        return event_stream(_events(firsts, streams, runs, rid, created, model.api_name, chat, include_usage,
                                    continuous))


async def _whole(request: Request, front: Frontend, runs: list[Choice], rid: str, created: int, chat: bool,
                 guide: str | None = None):
    """One response with a choice per prompt, their Triton requests in flight together."""
    texts = await front.texts(request, runs, guide)
    choices = []
    for i, (run, text) in enumerate(zip(runs, texts, strict=True)):
        logprobs = run.logprobs_body()
        if chat:  # the message first: a choice that called tools finishes for them
            deltas = run.deltas(text, final=True)
            message = merge_deltas(deltas)  # content and tool calls; the reasoning is joined here
            if run.reasoning is not None:
                said = "".join(d["reasoning_content"] for d in deltas if "reasoning_content" in d)
                message["reasoning_content"] = said or None
                if run.reasoned and not message["content"]:  # all reasoning (max_tokens ran out in it)
                    message["content"] = None
            choices.append({"index": i, "message": message, "logprobs": logprobs,
                            "finish_reason": run.finish_reason()})
        else:
            choices.append({"index": i, "text": text, "logprobs": logprobs,
                            "finish_reason": run.finish_reason()})
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": front.model.api_name, "choices": choices, "usage": usage_of(runs),
            "trtspec": figures_of(runs)}


async def _events(firsts: list, streams: list[AsyncIterator], runs: list[Choice], rid: str, created: int,
                  model: str, chat: bool, include_usage: bool,
                  continuous: bool = False) -> AsyncIterator[bytes]:
    """Server-sent events of every choice (a prompt each), chunks tagged by choice index; with
    `continuous` (vLLM's continuous_usage_stats) each chunk carries its choice's usage so far."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def usage(i: int) -> dict:
        if not continuous:
            return {"usage": None} if include_usage else {}
        run = runs[i]
        return {"usage": {"prompt_tokens": run.prompt_tokens, "completion_tokens": run.completion_tokens,
                          "total_tokens": run.prompt_tokens + run.completion_tokens}}

    def chunk(i: int, text: str | None, finish: str | None, role: bool = False, extra: dict | None = None,
              logprobs: dict | None = None, delta: dict | None = None) -> bytes:
        if chat:
            delta = delta if delta is not None else {} if text is None else {"content": text}
            if role:
                delta = {"role": "assistant", "content": ""}
            choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": i, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        return sse({"id": rid, "object": kind, "created": created, "model": model, "choices": [choice],
                    **usage(i), **(extra or {})})

    steps = merged(firsts, streams)
    try:
        if chat:
            for i in range(len(runs)):
                yield chunk(i, None, None, role=True)
        async for i, step in steps:
            run = runs[i]
            text = run.take(step)
            logprobs = run.logprobs_body()  # this step's tokens', also when their text is held back
            if chat:  # content, or tool calls; a step's log-probabilities ride on its first delta
                for delta in run.deltas(text, step.final) or ([{}] if logprobs else []):
                    yield chunk(i, None, None, logprobs=logprobs, delta=delta)
                    logprobs = None
            elif text or logprobs:
                yield chunk(i, text, None, logprobs=logprobs)
            if step.final:
                figures = {"trtspec": figures_of(runs, i)}
                yield chunk(i, None if chat else "", run.finish_reason(), extra=figures)
        if include_usage:
            yield sse({"id": rid, "object": kind, "created": created, "model": model, "choices": [],
                       "usage": usage_of(runs), "trtspec": figures_of(runs)})
    except TritonError as exc:  # mid-stream: an error event in OpenAI's shape, then the end
        yield sse(triton_error(exc).body())
    finally:
        await steps.aclose()
    yield sse("[DONE]")
