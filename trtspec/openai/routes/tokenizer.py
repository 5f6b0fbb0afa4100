"""vLLM's tokenizer routes, `/tokenize`, `/detokenize` and `/tokenizer_info` (lm-evaluation-harness's
remote tokenizer uses them); behind the API key like `/v1`."""

from __future__ import annotations

from fastapi import FastAPI, Request

from trtspec.openai.frontend import Frontend
from trtspec.openai.protocol import ApiError, DetokenizeRequest, TokenizeRequest, check_messages, parse
from trtspec.openai.tools import tool_plan


def add_routes(app: FastAPI, front: Frontend) -> None:
    model = front.model

    @app.post("/tokenize")
    async def tokenize(request: Request):
        req = parse(TokenizeRequest, await front.body(request))
        front.check_model(req.model, required=False)
        if (req.prompt is None) == (req.messages is None):
            raise ApiError("give one of 'prompt' (text) or 'messages' (a conversation).", "prompt")
        if req.messages is not None:
            if req.add_generation_prompt is False:
                raise ApiError("'add_generation_prompt'=False is not supported by trtspec: the chat template "
                               "opens the assistant's turn.", "add_generation_prompt",
                               code="unsupported_value")
            variables = req.chat_template_kwargs
            tools = tool_plan(req.tools, "none", None, None)  # checked as chat checks them
            messages = check_messages(req.messages, variables)
            text = front.render_chat(messages, variables, tools and tools.tools)
            specials = bool(req.add_special_tokens)
        else:
            text, specials = req.prompt, req.add_special_tokens is not False
        ids = model.encode(text, specials)
        strs = [model.tokenizer.token_bytes(i).decode("utf-8", errors="replace") for i in ids] \
            if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": model.context_length, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req = parse(DetokenizeRequest, await front.body(request))
        front.check_model(req.model, required=False)
        bad = [t for t in req.tokens if not 0 <= t < model.vocab_size]
        if bad:
            raise ApiError(f"Invalid 'tokens': token id {bad[0]} is outside the vocabulary "
                           f"[0, {model.vocab_size}).", "tokens", code="invalid_value")
        return {"prompt": model.tokenizer.decode(req.tokens)}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        hf = getattr(model.tokenizer, "hf", None)
        return {"tokenizer_class": type(hf or model.tokenizer).__name__,
                "model_max_length": model.context_length, "vocab_size": model.vocab_size,
                **{f"{name}_token": model.special_token(name) for name in ("eos", "bos", "pad")},
                "chat_template": None if model.chat is None else model.chat.text}
