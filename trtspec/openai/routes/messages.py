"""Anthropic's Messages API, `/v1/messages` and `/v1/messages/count_tokens`, over the chat path
(`trtspec/openai/anthropic_messages.py` translates a request to a chat request and the answer to
content blocks); its errors in Anthropic's shape."""

from __future__ import annotations

from fastapi import FastAPI, Request

from trtspec.openai.anthropic_messages import (
    RENAMES,
    ContentBlocks,
    CountTokensRequest,
    MessagesRequest,
    chat_body,
    check_messages_request,
    message_id,
    stop_reason,
    usage,
)
from trtspec.openai.choice import figures_of
from trtspec.openai.frontend import Frontend
from trtspec.openai.protocol import parse
from trtspec.openai.streams import stream_segments


def add_routes(app: FastAPI, front: Frontend) -> None:
    model = front.model

    @app.post("/v1/messages")
    async def create_message(request: Request):
        req = parse(MessagesRequest, await front.body(request))
        front.check_model(req.model)
        check_messages_request(req)
        _, run, guide = front.chat_turn(chat_body(req), RENAMES)
        mid, blocks = message_id(), ContentBlocks()

        def message(stop: tuple[str | None, str | None], output_tokens: int) -> dict:
            return {"id": mid, "type": "message", "role": "assistant", "model": model.api_name,
                    "content": blocks.content() if stop[0] else [], "stop_reason": stop[0],
                    "stop_sequence": stop[1],
                    "usage": usage(run.prompt_tokens, run.cached, output_tokens),
                    "trtspec": figures_of([run])}

        def ended() -> tuple[str, str | None]:
            return stop_reason(run.finish_reason(), blocks.blocks, run.trimmer.matched, req.stop_sequences)

        if not req.stream:
            await front.whole_segments(request, run, guide, blocks)
            return message(ended(), run.completion_tokens)
        firsts, streams = await front.started(request, [run], guide)
        run.cached = firsts[0].cached_tokens  # known with the first response, sent before its text

        def tail(status: str) -> list[dict]:
            reason, sequence = ended()
            delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                     "usage": usage(run.prompt_tokens, run.cached, run.completion_tokens),
                     "trtspec": figures_of([run])}
            return [*blocks.at_least_one(), delta, {"type": "message_stop"}]

        return stream_segments(
            firsts, streams, run, blocks,
            head=lambda: [{"type": "message_start", "message": message((None, None), 0)}], tail=tail,
            failed=lambda text: [{"type": "error", "error": {"type": "api_error", "message": text}}])

    @app.post("/v1/messages/count_tokens")
    async def count_message_tokens(request: Request):
        req = parse(CountTokensRequest, await front.body(request))
        front.check_model(req.model)
        prompt, _, _ = front.chat_turn(chat_body(req), RENAMES, generate=False)
        return {"input_tokens": len(model.encode(prompt, False))}
