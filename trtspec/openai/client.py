"""Client of any OpenAI-compatible server (trtspec serve, trtllm-serve, vLLM, SGLang): `openai://HOST:PORT`.

Standard library only, so `verify` and `bench` need nothing the server side does not. Streaming
reads the server-sent events line by line and times them as a user sees them: the first chunk
that carries text is the first token (a chat stream's opening role-only chunk is not). Token
counts come from `usage` (`stream_options.include_usage`); speculative figures from the
`trtspec` field when the server is trtspec (other servers leave them, and τ, at None). No server
sends token ids here: `token_ids` stays None.
"""

from __future__ import annotations

import json
import time
import urllib.request

from trtspec.triton.client import (
    TOTALS,
    ClientError,
    Completion,
    GenerateParams,
    TextCallback,
    answer_json,
    error_of,
    post_json,
    split_url,
    sse_events,
    typed,
    unexpected,
)

SCHEME = "openai"


def base_url(url: str) -> str:
    """`openai://HOST:PORT` -> `http://HOST:PORT/v1`."""
    scheme, address = split_url(url)
    if scheme != SCHEME:
        raise ClientError(f"--url {url!r}: expected openai://HOST:PORT")
    return f"http://{address}/v1"


def request_body(model: str, prompt: str, params: GenerateParams, chat: bool) -> dict:
    body: dict = {"model": model, "max_tokens": params.max_tokens, "stream": params.stream,
                  "temperature": 0.0 if params.temperature is None else params.temperature}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if params.stream:
        body["stream_options"] = {"include_usage": True}
    if params.top_p is not None:  # always: a server's default may be the model's recommendation
        body["top_p"] = params.top_p
    if params.top_k:  # an extension (vLLM, SGLang, trtllm-serve, trtspec): only sent when it matters
        body["top_k"] = params.top_k
    if params.min_p:  # vLLM's extension, as top_k
        body["min_p"] = params.min_p
    if params.seed is not None:
        body["seed"] = params.seed
    body.update(params.penalties())  # repetition_penalty: vLLM's extension, as trtspec's and SGLang's
    if params.logit_bias:  # OpenAI's: token ids as strings
        body["logit_bias"] = {str(token): bias for token, bias in params.logit_bias}
    if params.stop_words:
        body["stop"] = list(params.stop_words)
    if params.bad_words:  # vLLM's extension, as trtspec's
        body["bad_words"] = list(params.bad_words)
    if params.thinking is not None:
        raise ClientError("a reasoning budget with its own start and end tags is trtspec's Triton inputs' "
                          "(thinking_token_budget, thinking_start, thinking_end); an OpenAI server takes "
                          "thinking_token_budget on /v1/chat/completions only, behind its reasoning parser")
    if params.guide is not None:
        body["response_format"] = response_format(*params.guide)
    if params.cache_salt:  # vLLM's extension, as trtspec's
        body["cache_salt"] = params.cache_salt
    return body


def response_format(guide_type: str, guide: str) -> dict:
    """A guide (TensorRT-LLM's guide type and text) as the response_format that asks for it: OpenAI's
    json_object and json_schema; regex and ebnf as trtllm-serve and trtspec take them."""
    if guide_type == "json":
        return {"type": "json_object"}
    if guide_type == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": "guide", "schema": json.loads(guide)}}
    if guide_type == "regex":
        return {"type": "regex", "regex": guide}
    return {"type": "ebnf", "ebnf": guide}


def bearer(api_key: str | None) -> dict[str, str]:
    """The header that carries an API key (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _post(url: str, body: dict, api_key: str | None, timeout_s: float):
    headers = {"Content-Type": "application/json", **bearer(api_key)}
    return post_json(urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers), timeout_s,
                     api="openai")


def _text_of(choice: dict, chat: bool, where: str, at: str) -> str:
    """A choice's new text: chat's delta (or message) content, a completion's text."""
    if not chat:
        return typed(choice, "text", str, "text", where, at) or ""
    name = "delta" if "delta" in choice else "message"
    part = typed(choice, name, dict, "an object", where, at) or {}
    return typed(part, "content", str, "text", where, f"{at}{name}.") or ""


def _fold(completion: Completion, body, chat: bool, on_text: TextCallback | None, t0: float,
          where: str) -> None:
    """One answer (or stream chunk) into `completion`; a ClientError naming any field that is not
    what the OpenAI API sends there."""
    if not isinstance(body, dict):
        raise unexpected(where, None, body, "a JSON object")
    if "error" in body:
        raise ClientError(f"{where}: {error_of(body, body)}")
    completion.num_responses += 1
    for i, choice in enumerate(typed(body, "choices", list, "a list of choices", where) or []):
        at = f"choices[{i}]."
        if not isinstance(choice, dict):
            raise unexpected(where, f"choices[{i}]", choice, "a choice object")
        text = _text_of(choice, chat, where, at)
        if text:
            completion.arrived(time.perf_counter() - t0)
            completion.text += text
            if on_text is not None:
                on_text(text)
        finish = typed(choice, "finish_reason", str, "text", where, at)
        if finish:
            completion.finish_reason = finish
    usage = typed(body, "usage", dict, "an object", where)
    if usage:
        completion.completion_tokens = typed(usage, "completion_tokens", int, "an integer", where, "usage.")
    figures = typed(body, "trtspec", dict, "an object", where) or {}
    for name in (*TOTALS, "seed"):
        typed(figures, name, int, "an integer", where, "trtspec.")
    completion.fold_totals(figures)
    if figures.get("seed") is not None:
        completion.seed = figures["seed"]


def openai_generate(url: str, model: str, prompt: str, params: GenerateParams,
                    on_text: TextCallback | None = None, timeout_s: float = 300.0, chat: bool = False,
                    api_key: str | None = None) -> Completion:
    """One request to `/v1/completions` (or `/v1/chat/completions` with `chat`). A stream must end
    with `data: [DONE]`, as every OpenAI server ends one: without it the answer was cut short."""
    endpoint = f"{base_url(url)}/{'chat/completions' if chat else 'completions'}"
    completion, t0 = Completion(), time.perf_counter()
    with _post(endpoint, request_body(model, prompt, params, chat), api_key, timeout_s) as resp:
        if params.stream:
            for body in sse_events(resp, endpoint, until_done=True):
                _fold(completion, body, chat, on_text, t0, endpoint)
        else:
            _fold(completion, answer_json(resp.read(), endpoint), chat, on_text, t0, endpoint)
    completion.total_s = time.perf_counter() - t0
    return completion


def openai_ready(url: str, model: str, api_key: str | None = None) -> bool:
    """The server lists `model` under /v1/models."""
    req = urllib.request.Request(f"{base_url(url)}/models", headers=bearer(api_key))
    with urllib.request.urlopen(req, timeout=5) as resp:
        try:
            cards = json.loads(resp.read())["data"]
            return any(isinstance(card, dict) and card.get("id") == model for card in cards)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):  # no list of models: not ready
            return False
