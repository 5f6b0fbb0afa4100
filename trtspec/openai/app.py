"""The OpenAI-compatible routes: `/v1/models` (and `/v1/models/{model}`), `/v1/completions`,
`/v1/chat/completions`, `/v1/responses` (and `/v1/responses/{id}`: `responses`, over the chat
path; background responses too), `/v1/conversations` (`conversations`), `/health`; and Anthropic's
`/v1/messages` (`anthropic_messages`, over the chat path too). Web pages of the allowed origins
may call them from a browser (`cors`).
Every error, a missing route's too, is in OpenAI's shape (Anthropic's on its routes).

Each request is checked (`protocol`), its prompt built (chat template) and counted, then sent to
the Triton model over one gRPC stream (`triton_stream`). Streaming answers are server-sent events
as OpenAI's clients parse them: `data: {chunk}` per decode step (the first chat chunk carries the
role), a chunk with `finish_reason`, a usage chunk when `stream_options.include_usage`, then
`data: [DONE]`. Speculative figures ride in a `trtspec` field: `accepted_tokens`, `draft_tokens`,
`target_forwards`.
Log-probabilities (`logprobs`) come with the text they belong to, a step's tokens per chunk.
With a reasoning parser (`reasoning`), a chat answer's reasoning block comes as `reasoning_content`.
A client that disconnects ends its Triton request. With an API key, every `/v1` route needs
`Authorization: Bearer KEY` and answers 401 before anything runs.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match

from trtspec.openai.anthropic_messages import RENAMES as ANTHROPIC_RENAMES
from trtspec.openai.anthropic_messages import (
    ContentBlocks,
    CountTokensRequest,
    MessagesRequest,
    check_messages_request,
    error_body,
    message_id,
    stop_reason,
)
from trtspec.openai.anthropic_messages import chat_body as anthropic_body
from trtspec.openai.anthropic_messages import usage as anthropic_usage
from trtspec.openai.conversations import (
    ConversationRequest,
    ConversationStore,
    ItemsRequest,
    checked_metadata,
    conversation_id,
    kept_items,
    new_items,
)
from trtspec.openai.cors import allow_origins
from trtspec.openai.logprobs import LogprobsBody
from trtspec.openai.metrics import FrontendMetrics
from trtspec.openai.middleware import PARAM, Authorize, CountAnswers, NoTrailingSlash
from trtspec.openai.model_info import ServedModel
from trtspec.openai.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    Renames,
    TokenizeRequest,
    check_chat,
    check_completion,
    check_messages,
    compact_json_wanted,
    guide_field,
    guide_of,
    logit_bias_pairs,
    logprobs_wanted,
    parse,
    prediction_text,
    rename,
    renamed,
    stop_list,
    template_variables,
)
from trtspec.openai.reasoning import (
    CONTENT,
    OPENS_TAG,
    THINK_OPEN,
    ReasoningParser,
    answer_start,
    reasoning_guide,
)
from trtspec.openai.responses import (
    FINISHED,
    LOGPROBS,
    RENAMES,
    Background,
    OutputItems,
    ResponsesRequest,
    ResponseStore,
    assistant_messages,
    chat_body,
    check_responses,
    input_items,
    input_messages,
    item_page,
    namespaced,
    page_of,
    response_object,
    truncations,
)
from trtspec.openai.segments import REASONING, Segments, named_sse
from trtspec.openai.stops import StopTrimmer
from trtspec.openai.tools import ToolParser, ToolPlan, check_tools, merge_deltas, tool_plan
from trtspec.openai.triton_stream import Generation, TritonError, TritonStream
from trtspec.spec.coupling import fresh_seed
from trtspec.spec.grammar import GuideError, compact_guide
from trtspec.triton.request import MAX_SALT_CHARS, produced_chars

log = logging.getLogger(__name__)

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
TOKENIZER_ROUTES = ("/tokenize", "/detokenize", "/tokenizer_info")  # vLLM's; behind the key like /v1
ANTHROPIC_ROUTES = ("/v1/messages",)  # errors in Anthropic's shape


def _route_of(app: FastAPI, scope: dict) -> str:
    """A request's route as its template (`/v1/responses/{rid}`), `other` for none."""
    for route in app.router.routes:
        if route.matches(scope)[0] is Match.FULL:
            return route.path
    return "other"


def _error(exc: ApiError, headers: dict | None = None, path: str = "") -> JSONResponse:
    """`exc` in OpenAI's shape, or on Anthropic's routes (/v1/messages) in Anthropic's."""
    body = error_body(exc) if path.startswith(ANTHROPIC_ROUTES) else exc.body()
    return JSONResponse(body, status_code=exc.status, headers=headers)


class Frontend:
    """Turns checked OpenAI requests into Triton requests and Triton steps into OpenAI bodies."""

    def __init__(self, model: ServedModel, triton: TritonStream):
        self.model, self.triton = model, triton

    def generation(self, req, prompt: str | list[int], chat: bool, default_max: int | None,
                   param: str, tools: ToolPlan | None = None,
                   start: str | None = None) -> tuple[Generation, list[int]]:
        """The Triton request for `req` on `prompt` (text, or token ids sent as they are), and the
        prompt's token ids. `param`: the request parameter that holds the prompt; `tools`: the chat
        request's tool calling, whose guide (named, required) is the request's; `start`: where a
        reasoning parser's answer starts (`reasoning.answer_start`), whose guide then holds the text
        after the reasoning."""
        model = self.model
        specials = (not chat) if req.add_special_tokens is None else req.add_special_tokens
        prompt_ids = prompt if isinstance(prompt, list) else model.encode(prompt, specials)
        prompt_tokens = len(prompt_ids)
        room = model.context_length - prompt_tokens
        if room < 1:
            raise ApiError(f"This model's maximum context length is {model.context_length} tokens. "
                           f"However, your {param} resulted in {prompt_tokens} tokens.", param,
                           code="context_length_exceeded")
        if model.max_input_tokens is not None and prompt_tokens > model.max_input_tokens:
            raise ApiError(f"This deployment takes prompts of up to {model.max_input_tokens} tokens "
                           f"(limits.max_input_tokens). However, your {param} resulted in {prompt_tokens} "
                           "tokens.", param, code="context_length_exceeded")
        # chat's max_completion_tokens wins (check_chat refused the two disagreeing); 0 is a value
        completion = getattr(req, "max_completion_tokens", None)
        name = "max_tokens" if completion is None else "max_completion_tokens"
        max_tokens = req.max_tokens if completion is None else completion
        if max_tokens is None:
            max_tokens = min(default_max or room, room, model.max_tokens)
        if not 1 <= max_tokens <= model.max_tokens:
            raise ApiError(f"Invalid '{name}': {max_tokens}; this deployment generates 1 to "
                           f"{model.max_tokens} tokens per request.", name, code="invalid_value")
        if prompt_tokens + max_tokens > model.context_length:
            raise ApiError(f"This model's maximum context length is {model.context_length} tokens. "
                           f"However, you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in "
                           f"the {param}, {max_tokens} in the completion).", param,
                           code="context_length_exceeded")
        if req.min_tokens is not None and not 0 <= req.min_tokens <= max_tokens:
            raise ApiError(f"Invalid 'min_tokens': {req.min_tokens}; expected 0 to {name}={max_tokens}.",
                           "min_tokens", code="invalid_value")
        stops = stop_list(req.stop) + list(model.chat.stop if chat else ())
        # what the request leaves out: the checkpoint's recommendation, else OpenAI's defaults
        defaults = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, **model.sampling_defaults}
        temperature = defaults["temperature"] if req.temperature is None else req.temperature
        top_p = defaults["top_p"] if req.top_p is None else req.top_p
        # k at or past the vocabulary keeps every token, as 0 does (and fits the model's int32 input)
        top_k = defaults["top_k"] if req.top_k is None else max(0, req.top_k)
        top_k = 0 if top_k >= model.vocab_size else top_k
        logprobs = logprobs_wanted(req)
        echo = bool(getattr(req, "echo", False))
        if req.cache_salt is not None and not 1 <= len(req.cache_salt) <= MAX_SALT_CHARS:
            raise ApiError(f"Invalid 'cache_salt': expected 1 to {MAX_SALT_CHARS} characters, got "
                           f"{len(req.cache_salt)}.", "cache_salt", code="invalid_value")
        gen = Generation(prompt=prompt if isinstance(prompt, str) else "", max_tokens=max_tokens,
                         temperature=temperature, top_p=top_p, top_k=top_k, min_p=req.min_p or 0.0,
                         seed=req.seed,
                         min_tokens=req.min_tokens or 0, stop_words=tuple(stops), stream=bool(req.stream),
                         add_special_tokens=specials, stop_token_ids=tuple(req.stop_token_ids or ()),
                         ignore_eos=bool(req.ignore_eos), logprobs=logprobs,
                         prompt_ids=tuple(prompt) if isinstance(prompt, list) else None,
                         prompt_logprobs=echo and logprobs is not None,
                         presence_penalty=req.presence_penalty or 0.0,
                         frequency_penalty=req.frequency_penalty or 0.0,
                         repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                         logit_bias=logit_bias_pairs(req.logit_bias, model.vocab_size),
                         guide=self.guide(req, tools, start, self.model.compact_json),
                         bad_words=tuple(req.bad_words or ()),
                         thinking=self.thinking(req, start),
                         prediction=prediction_text(req) if chat else "",
                         cache_salt=req.cache_salt or "")
        return gen, prompt_ids

    @staticmethod
    def thinking(req, start: str | None) -> tuple[int, str] | None:
        """The request's reasoning budget as the model takes it: (tokens, the text that opens the block
        at the answer's start, "" where the prompt opened it); None: no budget, or no block to budget
        (the template closed it)."""
        budget = getattr(req, "thinking_token_budget", None)
        if budget is None:
            return None
        if start is None:
            raise ApiError("'thinking_token_budget' needs a server started with --reasoning-parser, which "
                           "knows where the reasoning block ends; this one has none.",
                           "thinking_token_budget", code="unsupported_value")
        if budget < 0:
            raise ApiError(f"Invalid 'thinking_token_budget': {budget}; expected an integer >= 0.",
                           "thinking_token_budget", code="invalid_value")
        if start == CONTENT:
            return None
        return budget, THINK_OPEN if start == OPENS_TAG else ""

    @staticmethod
    def guide_param(req, tools: ToolPlan | None) -> str | None:
        """The parameter that asked for the request's guide (a tool_choice's wins), to name where
        the model refuses it; None: no guide."""
        return tools.param if tools is not None and tools.guide else guide_field(req)

    @staticmethod
    def guide(req, tools: ToolPlan | None, start: str | None,
              compact: bool = False) -> tuple[str, str] | None:
        """The request's guide (a tool_choice's wins, written compactly already), its JSON written
        compactly where the request says so, or `compact` (the server's --compact-json) unless it says
        not, after the reasoning block when `start` says the answer has one."""
        if tools is not None and tools.guide:
            guide, param = tools.guide, tools.param
        else:
            guide, param = guide_of(req), guide_field(req)
            asked = compact_json_wanted(req)
            if guide is not None and (compact if asked is None else asked):
                try:
                    guide = compact_guide(*guide)
                except GuideError as exc:
                    raise ApiError(f"Invalid '{param}': {exc}.", param, code="invalid_value") from None
        if guide is None or start is None:
            return guide
        try:
            return reasoning_guide(guide, start)
        except GuideError as exc:
            raise ApiError(f"Invalid '{param}': {exc}.", param, code="invalid_value") from None

    def check_model(self, name: str | None, required: bool = True) -> None:
        if (required or name is not None) and name not in self.model.api_names:
            raise ApiError(f"The model `{name}` does not exist.", "model", status=404, code="model_not_found")


class ClientGone(Exception):
    """The HTTP client went away before its answer; what it asked for was cancelled."""


async def _watch_disconnect(request: Request, task: asyncio.Future) -> None:
    """Cancel `task` when the HTTP client goes away (the body is read, so only that comes)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            task.cancel()
            return


async def _unless_gone(request: Request | None, work: asyncio.Future):
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


class _Run:
    """One choice's figures while its steps arrive."""

    def __init__(self, gen: Generation, prompt_ids: list[int], sample: int = 0,
                 logprobs: LogprobsBody | None = None, echo: str | None = None,
                 decode: Callable[[list[int]], str] | None = None, include: tuple[str, ...] = (),
                 tools: ToolPlan | None = None, start: str | None = None, show_reasoning: bool = True):
        self.gen, self.prompt_ids, self.prompt_tokens = gen, prompt_ids, len(prompt_ids)
        self.sample = sample  # j of the prompt's n choices
        self.trimmer = StopTrimmer(stop_list(list(gen.stop_words)), protected=None if gen.min_tokens else 0,
                                   include=frozenset(include))  # stops kept in the text
        self.decode = decode  # the tokenizer's: where the first min_tokens tokens' text ends
        self.ids: list[int] = []  # generated so far, while min_tokens has not been reached
        self.completion_tokens = self.accepted = self.drafted = self.forwards = self.cached = 0
        self.predicted = self.prediction_accepted = 0  # drafts from the prediction, and those accepted
        self.last_id: int | None = None
        self.finish: str | None = None  # the model's finish_reason, with its totals
        self.logprobs = logprobs  # None: the request asked for no log-probabilities
        self.scored: tuple[list, list, list, list] = ([], [], [], [])  # ids, log p, top ids, top log p
        self.echo = echo  # the prompt's text, owed before the first text (echo)
        if logprobs is not None and echo is not None:  # the completion's offsets count from its end
            logprobs.prompt = (len(prompt_ids), len(echo))
        self.tools = None if tools is None else ToolParser(tools)  # the text as content and tool calls
        # the reasoning block apart from the content (None: no reasoning parser); shown unless asked not to
        self.reasoning = None if start is None else ReasoningParser(start)
        self.show_reasoning = show_reasoning
        self.reasoned = False  # some of the text was reasoning

    def take(self, step) -> str:
        self.completion_tokens += len(step.ids)
        if self.trimmer.protected is None:  # a stop sequence may end only past these tokens' text
            self.ids += step.ids
            if len(self.ids) >= self.gen.min_tokens:
                self.trimmer.protected = produced_chars(self.decode, self.ids[: self.gen.min_tokens])
        if step.ids:
            self.last_id = step.ids[-1]
        self.accepted = max(self.accepted, step.accepted_tokens)
        self.drafted = max(self.drafted, step.draft_tokens)
        self.forwards = max(self.forwards, step.target_forwards)
        self.cached = max(self.cached, step.cached_tokens)
        self.predicted = max(self.predicted, step.prediction_tokens)
        self.prediction_accepted = max(self.prediction_accepted, step.accepted_prediction_tokens)
        self.finish = step.finish_reason or self.finish
        echo, self.echo = self.echo, None
        if self.logprobs is not None:
            if echo is not None:  # the prompt's tokens first; nothing scores its first
                self._score(self.prompt_ids, [None, *step.prompt_logprobs], [None, *step.prompt_top_ids],
                            [None, *step.prompt_top_logprobs])
            self._score(step.ids, step.logprobs, step.top_ids, step.top_logprobs)
        return (echo or "") + self.trimmer.push(step.text, final=step.final)

    def _score(self, *columns: list) -> None:
        for kept, new in zip(self.scored, columns, strict=True):
            kept += new

    def logprobs_body(self) -> dict | None:
        """The logprobs of the tokens taken since the last call (None: none asked for, or none new)."""
        if self.logprobs is None or not self.scored[0]:
            return None
        body = self.logprobs.body(*self.scored)
        self.scored = ([], [], [], [])
        return body

    def status(self) -> str:
        """The newer APIs' status of a finished choice: incomplete where its token limit ran out."""
        return "incomplete" if self.finish_reason() == "length" else "completed"

    def finish_reason(self) -> str:
        if self.trimmer.stopped:
            reason = "stop"  # a stop sequence
        elif self.finish is not None:  # the model's: an end id on the last allowed token is a stop
            reason = self.finish
        else:
            reason = "stop" if self.completion_tokens < self.gen.max_tokens else "length"
        return reason if self.tools is None else self.tools.finish_reason(reason)

    def deltas(self, text: str, final: bool) -> list[dict]:
        """A chat choice's new text as message deltas: reasoning, then content or tool calls found
        in the content."""
        out = []
        if self.reasoning is not None:
            reasoning, text = self.reasoning.push(text)
            if final:
                more, text_more = self.reasoning.finish()
                reasoning, text = reasoning + more, text + text_more
            self.reasoned = self.reasoned or bool(reasoning)
            if reasoning and self.show_reasoning:
                out.append({"reasoning_content": reasoning})
        if self.tools is None:
            return out + ([{"content": text}] if text else [])
        if text or self.reasoning is None:  # a named call starts with the content's first text
            out += self.tools.push(text)
        return out + (self.tools.finish() if final else [])

    def figures(self) -> dict:
        return {"accepted_tokens": self.accepted, "draft_tokens": self.drafted,
                "target_forwards": self.forwards, "cached_tokens": self.cached}


def _sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def create_app(model: ServedModel, triton: TritonStream, api_key: str | None = None,
               allowed_origins: tuple[str, ...] = ()) -> FastAPI:
    """The API of `model` served over `triton`; `api_key`: the key every /v1 route asks for;
    `allowed_origins`: the web pages whose scripts may call it from a browser (cors.py)."""
    app = FastAPI(title="trtspec OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    front = Frontend(model, triton)

    metrics = FrontendMetrics()

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        setattr(request.state, PARAM, exc.param)  # read by CountAnswers
        return _error(exc, path=request.url.path)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone):
        """Nobody reads it: an answer instead of an 'Exception in ASGI application' in the log
        (499, nginx's 'client closed request')."""
        return Response(status_code=499)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        """Starlette's own answers (no such route, a method the route does not take) in OpenAI's shape."""
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            message = f"Invalid URL ({where}): no such route."
        elif exc.status_code == 405:
            message = f"Invalid method ({where}): the route takes {(exc.headers or {}).get('Allow')}."
        else:
            message = f"{exc.detail} ({where})"
        return _error(ApiError(message, status=exc.status_code), exc.headers, request.url.path)

    @app.get("/metrics")
    async def frontend_metrics():
        """The frontend's own counters (`trtspec/openai/metrics.py`); the model's are Triton's."""
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/health")
    async def health():
        if await triton.ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "unavailable"}, status_code=503)

    def card(name: str) -> dict:
        return {"id": name, "object": "model", "created": int(app.state.started), "owned_by": "trtspec",
                "max_model_len": model.context_length}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card(name) for name in model.api_names]}

    @app.get("/v1/models/{name:path}")  # a served name may hold a slash (org/model)
    async def retrieve_model(name: str):
        front.check_model(name)
        return card(name)

    app.state.started = time.time()

    async def body_of(request: Request):
        """The JSON body, whatever the Content-Type says (`curl -d` sends form-urlencoded); one over
        limits.max_request_bytes is a 413 before it is read whole (by its Content-Length, or as its
        chunks arrive)."""
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        sent = "" if kind in ("", "application/json") else f" (sent as Content-Type {kind})"
        limit = model.max_request_bytes
        too_large = ApiError(f"the request body holds more than {limit:,} bytes, the most this deployment "
                             "takes (limits.max_request_bytes)", status=413, code="request_too_large")
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > limit:
            raise too_large
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_large
        try:
            return json.loads(body)
        except json.JSONDecodeError as exc:
            raise ApiError(f"the request body is not valid JSON{sent}: {exc}") from None
        except UnicodeDecodeError:
            raise ApiError(f"the request body is not valid JSON{sent}: not UTF-8 text") from None
        except ValueError:  # json.loads' other refusal: an integer past Python's 4,300 digits
            raise ApiError("the request body is not valid JSON: it holds an integer of more than 4,300 "
                           "digits") from None
        except RecursionError:  # json.loads recurses per nesting level
            raise ApiError("the request body is not valid JSON: nested too deeply to parse") from None

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = parse(CompletionRequest, await body_of(request))
        front.check_model(req.model)
        prompts = check_completion(req, model.vocab_size)
        return await respond(request, req, prompts, False, COMPLETION_DEFAULT_MAX_TOKENS)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = parse(ChatRequest, await body_of(request))
        front.check_model(req.model)
        messages = check_chat(req, model.vocab_size)
        tools = check_tools(req, model.tool_parser)
        prompt, start = chat_prompt(req, messages, tools)
        return await respond(request, req, [prompt], True, None, tools, start)

    def chat_prompt(req: ChatRequest, messages: list[dict], tools: ToolPlan | None) -> tuple[str, str | None]:
        """A checked chat request's prompt through the template, and where its answer starts (the
        reasoning parser's `answer_start`; None: no parser)."""
        prompt = render_chat(messages, template_variables(req), None if tools is None else tools.tools)
        parser = model.reasoning_parser
        return prompt, None if parser is None else answer_start(parser, prompt)

    def render_chat(messages: list[dict], variables: dict | None, tools: list[dict] | None = None) -> str:
        if model.chat is None:
            raise ApiError(f"model `{model.api_name}` has no chat template; use /v1/completions", "messages")
        try:
            return model.chat.render(messages, **({"tools": tools} if tools else {}), **(variables or {}))
        except Exception as exc:  # noqa: BLE001 - a template's raise_exception or a rendering error
            raise ApiError(f"the chat template refused the messages: {exc}", "messages") from None

    # vLLM's tokenizer routes (lm-evaluation-harness's remote tokenizer uses them)
    @app.post("/tokenize")
    async def tokenize(request: Request):
        req = parse(TokenizeRequest, await body_of(request))
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
            text = render_chat(check_messages(req.messages, variables), variables, tools and tools.tools)
            specials = bool(req.add_special_tokens)
        else:
            text, specials = req.prompt, req.add_special_tokens is not False
        ids = model.encode(text, specials)
        strs = [model.tokenizer.token_bytes(i).decode("utf-8", errors="replace") for i in ids] \
            if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": model.context_length, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req = parse(DetokenizeRequest, await body_of(request))
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

    def runs_of(req, prompts: list[str | list[int]], chat: bool, default_max: int | None,
                tools: ToolPlan | None = None, start: str | None = None) -> list[_Run]:
        """A choice per prompt and sample, index = prompt × n + sample (vLLM's order); a sampled
        request without a seed gets one, reported in `trtspec.seed`."""
        runs, drawn = [], None
        for i, prompt in enumerate(prompts):
            param = "messages" if chat else "prompt" if len(prompts) == 1 else f"prompt[{i}]"
            gen, prompt_ids = front.generation(req, prompt, chat, default_max, param, tools, start)
            if gen.seed is None and gen.temperature > 0:
                drawn = fresh_seed() if drawn is None else drawn
                gen = dataclasses.replace(gen, seed=drawn)
            echo = None
            if getattr(req, "echo", False):
                echo = prompt if isinstance(prompt, str) else model.tokenizer.decode(prompt)
            for j in range(req.n or 1):
                seeded = gen if gen.seed is None else dataclasses.replace(gen, seed=(gen.seed + j) % 2**64)
                body = None if gen.logprobs is None else LogprobsBody(model.tokenizer, chat)
                included = tuple(stop_list(req.stop)) if req.include_stop_str_in_output else ()
                runs.append(_Run(seeded, prompt_ids, j, body, echo, model.tokenizer.decode, included, tools,
                                 start, getattr(req, "include_reasoning", None) is not False))
        return runs

    async def started(request: Request, runs: list[_Run], guide: str | None) -> tuple[list, list]:
        """Every choice's Triton stream and its first response: a refused request is an HTTP error,
        not a stream; a client that leaves meanwhile (queued for a decoder slot, in a long prefill)
        cancels them."""
        streams = [triton.generate(run.gen) for run in runs]
        try:
            firsts = await _unless_gone(request, asyncio.gather(*(anext(steps) for steps in streams),
                                                                return_exceptions=True))
        except ClientGone:
            for steps in streams:
                await steps.aclose()
            raise
        refused = next((f for f in firsts if isinstance(f, BaseException)), None)
        if refused is not None:
            for steps in streams:
                await steps.aclose()
            if isinstance(refused, TritonError):
                raise _triton_error(refused, guide) from None
            raise refused
        return firsts, streams

    async def respond(request: Request, req, prompts: list[str | list[int]], chat: bool,
                      default_max: int | None, tools: ToolPlan | None = None, start: str | None = None):
        runs = runs_of(req, prompts, chat, default_max, tools, start)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        guide = front.guide_param(req, tools)
        if not req.stream:
            return await _whole(request, front, runs, rid, created, chat, guide)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous = include_usage and req.stream_options.continuous_usage_stats
        firsts, streams = await started(request, runs, guide)
        return _event_stream(_events(firsts, streams, runs, rid, created, model.api_name, chat, include_usage,
                                     continuous))

    def chat_turn(body: dict, renames: Renames, generate: bool = True) -> tuple[str, _Run | None, str | None]:
        """A request of another API translated to a chat request (`body`), checked and built as chat's:
        its rendered prompt, its one choice (None unless `generate`) and the parameter that asked for
        its guide (named where the model refuses it). Refusals name that API's parameters (`renames`)."""
        try:
            chat = parse(ChatRequest, body)
            tools = check_tools(chat, model.tool_parser)
            prompt, start = chat_prompt(chat, check_chat(chat, model.vocab_size), tools)
            run = runs_of(chat, [prompt], True, None, tools, start)[0] if generate else None
        except ApiError as exc:
            raise renamed(exc, renames) from None
        guide = front.guide_param(chat, tools)
        return prompt, run, None if guide is None else rename(guide, renames)

    async def whole_segments(request: Request, run: _Run, guide: str | None, segments: Segments) -> str:
        """The one choice's whole answer as `segments`; its status (incomplete: the limit ran out)."""
        (text,) = await _texts(request, front, [run], guide)
        segments.scored(run.logprobs_body())
        segments.push(run.deltas(text, final=True))
        status = run.status()
        segments.close(status)
        return status

    def stream_segments(firsts: list, streams: list, run: _Run, segments: Segments, head: Callable,
                        tail: Callable, failed: Callable) -> ClosingStreamingResponse:
        return _event_stream(_named_events(_segment_events(firsts, streams, run, segments, head, tail,
                                                           failed)))

    store = ResponseStore()
    conversations = ConversationStore()

    @app.post("/v1/responses")
    async def create_response(request: Request):
        req = parse(ResponsesRequest, await body_of(request))
        front.check_model(req.model)
        check_responses(req)
        thread = None if req.conversation is None else \
            conversations.get(conversation_id(req.conversation), "conversation")
        if req.previous_response_id is not None:
            past = store.conversation(req.previous_response_id)
        else:
            past = [] if thread is None else thread.messages()
        conversation = past + input_messages(req.input)
        candidates = truncations(conversation) if req.truncation == "auto" else [conversation]
        for k, conversation in enumerate(candidates):  # the longest that fits
            try:
                _, run, guide = chat_turn(chat_body(req, conversation), RENAMES)
                break
            except ApiError as exc:
                if exc.code != "context_length_exceeded" or k == len(candidates) - 1:
                    raise
        # a reasoning block the answer may hold (CONTENT: the template closed it)
        opens_block = run.reasoning is not None and run.reasoning.state != CONTENT
        if run.logprobs is not None and (opens_block or run.tools is not None):
            raise ApiError(f"Invalid 'include': {LOGPROBS!r} is served where the answer is the message's "
                           "text alone; with tools or a reasoning block ask /v1/chat/completions (every "
                           "token's log-probabilities, in order).", "include", code="invalid_value")
        rid, created, items = f"resp_{uuid.uuid4().hex}", int(time.time()), OutputItems(namespaced(req.tools))
        added = False  # the response's items were added to its conversation

        def response(status: str, error: dict | None = None) -> dict:
            """The response object as it stands; a finished one is stored (a foreground one when it
            completed or is incomplete: a failed stream is not kept)."""
            nonlocal added
            usage = None
            if status in FINISHED:
                reasoning = items.text_of(REASONING)
                usage = {"input_tokens": run.prompt_tokens,
                         "input_tokens_details": {"cached_tokens": run.cached},
                         "output_tokens": run.completion_tokens, "output_tokens_details": {
                             "reasoning_tokens": len(model.encode(reasoning, False)) if reasoning else 0},
                         "total_tokens": run.prompt_tokens + run.completion_tokens}
            body = response_object(req, rid, created, model.api_name, items.items, status, usage,
                                   run.gen.temperature, run.gen.top_p, error, thread and thread.id)
            body["trtspec"] = _figures([run])
            continued = conversation + assistant_messages(items.items) \
                if status in ("completed", "incomplete") else None
            if continued is not None and thread is not None and not added:  # once, however often asked
                added = True
                thread.items += kept_items(req.input) + copy.deepcopy(items.items)  # the input checked
            if req.background:
                if status in FINISHED:
                    store.ended(body, continued)
            elif continued is not None and req.store is not False:
                store.put(body, continued, input_items(req.input))
            return body

        def failed(message: str, code: str = "server_error") -> list[dict]:
            return [items.event("response.failed", response=response("failed", {"code": code,
                                                                                 "message": message}))]

        if req.background:
            return in_background(req, run, guide, items, response, failed)
        if not req.stream:
            return response(await whole_segments(request, run, guide, items))
        firsts, streams = await started(request, [run], guide)
        return stream_segments(
            firsts, streams, run, items,
            head=lambda: [items.event(kind, response=response("in_progress"))
                          for kind in ("response.created", "response.in_progress")],
            tail=lambda status: [items.event(f"response.{status}", response=response(status))],
            failed=failed)

    background_runs: set[asyncio.Task] = set()
    app.state.background_runs = background_runs  # cancelled when the server stops

    def in_background(req: ResponsesRequest, run: _Run, guide: str | None, items: OutputItems,
                      response: Callable[..., dict], failed: Callable[..., list[dict]]):
        """A background response: stored queued and answered at once (its stream, when asked for),
        generated by a task of its own whose events the store keeps for GET ?stream=true."""
        job = Background(lambda: response(job.status))
        created = items.event("response.created", response=response("queued"))
        store.put(created["response"], None, input_items(req.input), job)
        job.add(created)
        job.add(items.event("response.queued", response=response("queued")))  # waiting for its task

        def head() -> list[dict]:
            job.status = "in_progress"
            return [items.event("response.in_progress", response=response("in_progress"))]

        def tail(status: str) -> list[dict]:
            job.status = status  # before its event: GET shows the end once it is sent
            return [items.event(f"response.{status}", response=response(status))]

        def fail(message: str, code: str = "server_error") -> list[dict]:
            job.status = "failed"
            return failed(message, code)

        async def generate() -> None:
            try:
                try:
                    firsts, streams = await started(None, [run], guide)
                except ApiError as exc:  # refused by the model (a guide it cannot compile, unavailable)
                    for event in fail(exc.message, exc.code or "server_error"):
                        job.add(event)
                    return
                async for event in _segment_events(firsts, streams, run, items, head, tail, fail):
                    job.add(event)
            except asyncio.CancelledError:  # cancelled (or the server stopping): no event says so
                job.status = "cancelled"
                response("cancelled")  # stored as it stood
            except Exception as exc:  # noqa: BLE001 - a bug: the response fails, the server goes on
                log.exception("background response %s failed", job.current()["id"])
                for event in fail(f"{type(exc).__name__}: {exc}"):
                    job.add(event)
            finally:
                job.end(job.status if job.status in FINISHED else "failed")
                background_runs.discard(job.task)

        job.task = asyncio.get_running_loop().create_task(generate())
        background_runs.add(job.task)
        if req.stream:
            return _event_stream(job.follow())
        return created["response"]

    @app.get("/v1/responses/{rid}")
    async def retrieve_response(rid: str, request: Request):
        kept = store.get(rid)
        query = request.query_params
        if query.get("stream", "false") not in ("true", "false"):
            raise ApiError(f"Invalid 'stream': {query['stream']!r}; expected true or false.", "stream",
                           code="invalid_value")
        if query.get("stream") != "true":
            return kept.now()
        if kept.background is None:
            raise ApiError(f"Invalid 'stream': response '{rid}' was not created with 'background': true; "
                           "only a background response's events are kept to stream again (GET it whole).",
                           "stream", code="invalid_value")
        after = query.get("starting_after", "-1")
        if not re.fullmatch(r"-1|[0-9]+", after):
            raise ApiError(f"Invalid 'starting_after': {after!r}; expected an event's sequence_number.",
                           "starting_after", code="invalid_value")
        return _event_stream(kept.background.follow(int(after)))

    @app.post("/v1/responses/{rid}/cancel")
    async def cancel_response(rid: str):
        kept = store.get(rid)
        job = kept.background
        if job is None:
            raise ApiError(f"Response '{rid}' was not created with 'background': true; only a background "
                           "response can be cancelled (a streamed one stops when its client leaves).",
                           code="invalid_value")
        if job.ended and job.status != "cancelled":
            raise ApiError(f"Response '{rid}' has ended ({job.status}); only a queued or in_progress "
                           "response can be cancelled.", code="invalid_value")
        if not job.ended:
            job.task.cancel()
            await asyncio.wait([job.task])  # its Triton request cancelled, the response stored as it stood
        return store.get(rid).now()

    @app.post("/v1/conversations")
    async def create_conversation(request: Request):
        req = parse(ConversationRequest, await body_of(request))
        return conversations.create(new_items(req.items), checked_metadata(req.metadata)).body()

    @app.get("/v1/conversations/{cid}")
    async def retrieve_conversation(cid: str):
        return conversations.get(cid).body()

    @app.post("/v1/conversations/{cid}")
    async def update_conversation(cid: str, request: Request):
        req = parse(ConversationRequest, await body_of(request))
        thread = conversations.get(cid)
        if req.items is not None:
            raise ApiError("Invalid 'items': a conversation's items are added with POST "
                           f"/v1/conversations/{cid}/items.", "items", code="invalid_value")
        thread.metadata = checked_metadata(req.metadata)
        return thread.body()

    @app.delete("/v1/conversations/{cid}")
    async def delete_conversation(cid: str):
        conversations.delete(cid)
        return {"id": cid, "object": "conversation.deleted", "deleted": True}

    @app.post("/v1/conversations/{cid}/items")
    async def add_conversation_items(cid: str, request: Request):
        req = parse(ItemsRequest, await body_of(request))
        thread = conversations.get(cid)
        added = new_items(req.items)
        thread.items += added
        return item_page(added, "asc", None, max(len(added), 1))

    @app.get("/v1/conversations/{cid}/items")
    async def list_conversation_items(cid: str, request: Request):
        return page_of(conversations.get(cid).items, request.query_params)

    @app.get("/v1/conversations/{cid}/items/{item_id}")
    async def retrieve_conversation_item(cid: str, item_id: str):
        return conversations.get(cid).item(item_id)

    @app.delete("/v1/conversations/{cid}/items/{item_id}")
    async def delete_conversation_item(cid: str, item_id: str):
        thread = conversations.get(cid)
        thread.items.remove(thread.item(item_id))
        return thread.body()

    @app.get("/v1/responses/{rid}/input_items")
    async def list_input_items(rid: str, request: Request):
        return page_of(store.get(rid).items, request.query_params)

    @app.delete("/v1/responses/{rid}")
    async def delete_response(rid: str):
        store.delete(rid)
        return {"id": rid, "object": "response", "deleted": True}

    @app.post("/v1/messages")
    async def create_message(request: Request):
        req = parse(MessagesRequest, await body_of(request))
        front.check_model(req.model)
        check_messages_request(req)
        _, run, guide = chat_turn(anthropic_body(req), ANTHROPIC_RENAMES)
        mid, blocks = message_id(), ContentBlocks()

        def message(stop: tuple[str | None, str | None], output_tokens: int) -> dict:
            return {"id": mid, "type": "message", "role": "assistant", "model": model.api_name,
                    "content": blocks.content() if stop[0] else [], "stop_reason": stop[0],
                    "stop_sequence": stop[1],
                    "usage": anthropic_usage(run.prompt_tokens, run.cached, output_tokens),
                    "trtspec": _figures([run])}

        def ended() -> tuple[str, str | None]:
            return stop_reason(run.finish_reason(), blocks.blocks, run.trimmer.matched, req.stop_sequences)

        if not req.stream:
            await whole_segments(request, run, guide, blocks)
            return message(ended(), run.completion_tokens)
        firsts, streams = await started(request, [run], guide)
        run.cached = firsts[0].cached_tokens  # known with the first response, sent before its text

        def tail(status: str) -> list[dict]:
            reason, sequence = ended()
            return [{"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                     "usage": anthropic_usage(run.prompt_tokens, run.cached, run.completion_tokens),
                     "trtspec": _figures([run])},
                    {"type": "message_stop"}]

        return stream_segments(
            firsts, streams, run, blocks,
            head=lambda: [{"type": "message_start", "message": message((None, None), 0)}], tail=tail,
            failed=lambda text: [{"type": "error", "error": {"type": "api_error", "message": text}}])

    @app.post("/v1/messages/count_tokens")
    async def count_message_tokens(request: Request):
        req = parse(CountTokensRequest, await body_of(request))
        front.check_model(req.model)
        prompt, _, _ = chat_turn(anthropic_body(req), ANTHROPIC_RENAMES, generate=False)
        return {"input_tokens": len(model.encode(prompt, False))}

    # each added runs before those added earlier (middleware.py)
    app.add_middleware(Authorize, api_key=api_key, guarded=_guarded, refuse=_unauthorized)
    app.add_middleware(CountAnswers, metrics=metrics, route_of=lambda scope: _route_of(app, scope))
    allow_origins(app, allowed_origins)  # a preflight needs no key
    app.add_middleware(NoTrailingSlash)  # the outermost: every route sees the path without one
    return app


def _guarded(path: str) -> bool:
    """Whether a path asks for the API key: the /v1 routes and vLLM's tokenizer routes."""
    return path.startswith("/v1") or path in TOKENIZER_ROUTES


def _unauthorized(message: str, path: str) -> JSONResponse:
    return _error(ApiError(message, status=401, code="invalid_api_key"), path=path)


def _event_stream(events: AsyncIterator[bytes]) -> ClosingStreamingResponse:
    """A server-sent event stream, closed when its response ends."""
    return ClosingStreamingResponse(events, media_type="text/event-stream",
                                    headers={"Cache-Control": "no-cache"})


def _triton_error(exc: TritonError, guide: str | None = None) -> ApiError:
    """The model's refusal as an OpenAI error; `guide`: the field that asked for a structured output,
    named where the model names its guided_decoding_guide."""
    if exc.unavailable:
        return ApiError(str(exc), status=503, kind="server_error", code="unavailable")
    message = str(exc)
    if guide is not None and "guided_decoding_guide" in message:  # the model's name for it
        return ApiError(message.replace("guided_decoding_guide", guide, 1), guide, code="invalid_value")
    return ApiError(message, code="invalid_value")


async def _texts(request: Request, front: Frontend, runs: list[_Run], guide: str | None) -> list[str]:
    """Each choice's whole text, their Triton requests in flight together."""
    async def collect(run: _Run) -> str:
        text = ""
        async for step in front.triton.generate(run.gen):
            text += run.take(step)
        return text

    each = [asyncio.ensure_future(collect(run)) for run in runs]
    try:
        return await _unless_gone(request, asyncio.gather(*each))
    except TritonError as exc:
        raise _triton_error(exc, guide) from None
    finally:
        for one in each:  # one prompt refused: the others' Triton requests end too
            one.cancel()


async def _whole(request: Request, front: Frontend, runs: list[_Run], rid: str, created: int, chat: bool,
                 guide: str | None = None):
    """One response with a choice per prompt, their Triton requests in flight together."""
    texts = await _texts(request, front, runs, guide)
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
            "model": front.model.api_name, "choices": choices, "usage": _usage(runs),
            "trtspec": _figures(runs)}


async def _merged(firsts: list, streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
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


async def _events(firsts: list, streams: list[AsyncIterator], runs: list[_Run], rid: str, created: int,
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
        return _sse({"id": rid, "object": kind, "created": created, "model": model, "choices": [choice],
                     **usage(i), **(extra or {})})

    steps = _merged(firsts, streams)
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
                figures = {"trtspec": _figures(runs, i)}
                yield chunk(i, None if chat else "", run.finish_reason(), extra=figures)
        if include_usage:
            yield _sse({"id": rid, "object": kind, "created": created, "model": model, "choices": [],
                        "usage": _usage(runs),
                        "trtspec": _figures(runs)})
    except TritonError as exc:  # mid-stream: an error event in OpenAI's shape, then the end
        yield _sse(_triton_error(exc).body())
    finally:
        await steps.aclose()
    yield _sse("[DONE]")


async def _segment_events(firsts: list, streams: list[AsyncIterator], run: _Run, segments: Segments,
                          head: Callable[[], list[dict]], tail: Callable[[str], list[dict]],
                          failed: Callable[[str], list[dict]]) -> AsyncIterator[dict]:
    """One choice's segments as an API's events (Responses, Anthropic's Messages): `head`'s, the
    segments' as the text comes, then `tail`'s for the answer's status (completed, or incomplete:
    the limit ran out); a model failing mid-stream ends it with `failed`'s for its message."""
    for event in head():
        yield event
    steps = _merged(firsts, streams)
    try:
        async for _, step in steps:
            text = run.take(step)
            segments.scored(run.logprobs_body())
            for event in segments.push(run.deltas(text, step.final)):
                yield event
        status = run.status()
        for event in segments.close(status) + tail(status):
            yield event
    except TritonError as exc:
        for event in segments.close("incomplete") + failed(_triton_error(exc).message):
            yield event
    finally:
        await steps.aclose()


async def _named_events(events: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    """Events as server-sent events that name their type."""
    try:
        async for event in events:
            yield named_sse(event)
    finally:
        await events.aclose()


def _usage(runs: list[_Run]) -> dict:
    """OpenAI's and vLLM's `usage`: each prompt counted once however many choices it has (`n`),
    every choice's generated tokens; `prompt_tokens_details.cached_tokens`: those of the prompts'
    tokens kept from an earlier request (prefix reuse), as OpenAI and vLLM report them."""
    prompt = sum(run.prompt_tokens for run in runs if run.sample == 0)
    cached = sum(run.cached for run in runs if run.sample == 0)
    completion = sum(run.completion_tokens for run in runs)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
             "prompt_tokens_details": {"cached_tokens": cached}}
    if any(run.gen.prediction for run in runs):  # OpenAI's counts of the predicted output's tokens
        accepted = sum(run.prediction_accepted for run in runs)
        usage["completion_tokens_details"] = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": sum(run.predicted for run in runs) - accepted}
    return usage


def _figures(runs: list[_Run], choice: int | None = None) -> dict:
    """The `trtspec` field: drafted and accepted tokens and target forwards of one choice (or all
    added up), and for a sampled request its seed (the one sent, or the one drawn for it): sent
    back as `seed`, it samples the same choices again (under Gumbel coupling exactly, under
    rejection sampling only when its draft lengths repeat too)."""
    figures = _summed(run.figures() for run in (runs if choice is None else [runs[choice]]))
    first = runs[0].gen  # choice j of a prompt samples with seed + j: the first's is the request's
    return figures if first.temperature == 0 else {**figures, "seed": first.seed}


def _summed(parts) -> dict:
    """Figures of several choices added up, key by key."""
    total: dict = {}
    for part in parts:
        for key, value in part.items():
            total[key] = total.get(key, 0) + value
    return total
