"""The path every generating route shares: a checked request's body read, its chat prompt rendered,
its choices built as Triton requests (`Frontend.generation`: limits, sampling defaults, guides, the
reasoning budget), started together, and their whole texts collected. The routes
(`trtspec/openai/routes/`) turn what comes back into their API's bodies and events."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

from fastapi import Request
from starlette.requests import ClientDisconnect

from trtspec.openai.choice import Choice
from trtspec.openai.logprobs import LogprobsBody
from trtspec.openai.model_info import ServedModel
from trtspec.openai.protocol import (
    ApiError,
    ChatRequest,
    Renames,
    check_chat,
    check_text,
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
from trtspec.openai.reasoning import CONTENT, OPENS_TAG, THINK_OPEN, answer_start, reasoning_guide
from trtspec.openai.segments import Segments
from trtspec.openai.streams import ClientGone, triton_error, unless_gone
from trtspec.openai.tools import ToolPlan, check_tools
from trtspec.openai.triton_stream import Generation, TritonError, TritonStream
from trtspec.spec.coupling import fresh_seed
from trtspec.spec.grammar import GuideError, compact_guide
from trtspec.triton.request import salt_length_problem

ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89abcdefABCDEF]")  # JSON's escape of half a surrogate pair


async def _closed(firsts: list[asyncio.Future], streams: list) -> None:
    """Cancel the choices' first reads, then close their streams (each cancels its Triton request)."""
    for first in firsts:
        first.cancel()
    await asyncio.gather(*firsts, return_exceptions=True)  # each stops reading before its stream closes
    for steps in streams:
        await steps.aclose()


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
        salt_problem = None if req.cache_salt is None else salt_length_problem(req.cache_salt)
        if salt_problem is not None:
            raise ApiError(f"Invalid 'cache_salt': {salt_problem}.", "cache_salt", code="invalid_value")
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

    async def body(self, request: Request):
        """The JSON body, whatever the Content-Type says (`curl -d` sends form-urlencoded); one over
        limits.max_request_bytes is a 413 before it is read whole (by its Content-Length, or as its
        chunks arrive)."""
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        sent = "" if kind in ("", "application/json") else f" (sent as Content-Type {kind})"
        limit = self.model.max_request_bytes
        too_large = ApiError(f"the request body holds more than {limit:,} bytes, the most this deployment "
                             "takes (limits.max_request_bytes)", status=413, code="request_too_large")
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > limit:
            raise too_large
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise too_large
        except ClientDisconnect:  # it closed before its body was whole: a 499, not a traceback
            raise ClientGone from None
        try:
            parsed = json.loads(body)
        except json.JSONDecodeError as exc:
            raise ApiError(f"the request body is not valid JSON{sent}: {exc}") from None
        except UnicodeDecodeError:
            raise ApiError(f"the request body is not valid JSON{sent}: not UTF-8 text") from None
        except ValueError:  # json.loads' other refusal: an integer past Python's 4,300 digits
            raise ApiError("the request body is not valid JSON: it holds an integer of more than 4,300 "
                           "digits") from None
        except RecursionError:  # json.loads recurses per nesting level
            raise ApiError("the request body is not valid JSON: nested too deeply to parse") from None
        if ESCAPED_SURROGATE.search(body):  # only a \\u escape makes one: UTF-8 text cannot
            check_text(parsed)
        return parsed

    def chat_prompt(self, req: ChatRequest, messages: list[dict],
                    tools: ToolPlan | None) -> tuple[str, str | None]:
        """A checked chat request's prompt through the template, and where its answer starts (the
        reasoning parser's `answer_start`; None: no parser)."""
        prompt = self.render_chat(messages, template_variables(req), None if tools is None else tools.tools)
        parser = self.model.reasoning_parser
        return prompt, None if parser is None else answer_start(parser, prompt)

    def render_chat(self, messages: list[dict], variables: dict | None,
                    tools: list[dict] | None = None) -> str:
        model = self.model
        if model.chat is None:
            raise ApiError(f"model `{model.api_name}` has no chat template; use /v1/completions", "messages")
        try:
            return model.chat.render(messages, **({"tools": tools} if tools else {}), **(variables or {}))
        except RecursionError:  # a value nested deeper than Jinja's rendering recurses
            raise ApiError("the chat template cannot render the messages: a value in them nests too deeply",
                           "messages") from None
        except Exception as exc:  # noqa: BLE001 - a template's raise_exception or a rendering error
            raise ApiError(f"the chat template refused the messages: {exc}", "messages") from None

    def choices_of(self, req, prompts: list[str | list[int]], chat: bool, default_max: int | None,
                tools: ToolPlan | None = None, start: str | None = None) -> list[Choice]:
        """A choice per prompt and sample, index = prompt × n + sample (vLLM's order); a sampled
        request without a seed gets one, reported in `trtspec.seed`."""
        runs, drawn = [], None
        for i, prompt in enumerate(prompts):
            param = "messages" if chat else "prompt" if len(prompts) == 1 else f"prompt[{i}]"
            gen, prompt_ids = self.generation(req, prompt, chat, default_max, param, tools, start)
            if gen.seed is None and gen.temperature > 0:
                drawn = fresh_seed() if drawn is None else drawn
                gen = dataclasses.replace(gen, seed=drawn)
            echo = None
            if getattr(req, "echo", False):
                echo = prompt if isinstance(prompt, str) else self.model.tokenizer.decode(prompt)
            for j in range(req.n or 1):
                seeded = gen if gen.seed is None else dataclasses.replace(gen, seed=(gen.seed + j) % 2**64)
                body = None if gen.logprobs is None else LogprobsBody(self.model.tokenizer, chat)
                included = tuple(stop_list(req.stop)) if req.include_stop_str_in_output else ()
                runs.append(Choice(seeded, prompt_ids, j, body, echo, self.model.tokenizer.decode, included,
                                   tools, start, getattr(req, "include_reasoning", None) is not False))
        held = self.model.max_held
        if held is not None and len(runs) > held:  # each choice a request: never all held at once
            param = "n" if (req.n or 1) > 1 else "prompt"
            raise ApiError(f"Invalid '{param}': {len(runs)} choices, more than the {held} requests the "
                           "deployment holds at once (limits.max_concurrency and limits.max_queued); ask for "
                           "fewer.", param, code="invalid_value")
        return runs

    async def started(self, request: Request, runs: list[Choice], guide: str | None) -> tuple[list, list]:
        """Every choice's Triton stream and its first response: a refused request is an HTTP error,
        not a stream; a client that leaves meanwhile (queued for a decoder slot, in a long prefill)
        cancels them."""
        streams = [self.triton.generate(run.gen) for run in runs]
        firsts = [asyncio.ensure_future(anext(steps)) for steps in streams]
        try:  # the first refusal answers at once (a busy server's, while the other choices wait)
            await unless_gone(request, asyncio.ensure_future(
                asyncio.wait(firsts, return_when=asyncio.FIRST_EXCEPTION)))
        except BaseException:  # the client went away, or this handler was cancelled: nothing is left running
            await _closed(firsts, streams)
            raise
        refused = next((f.exception() for f in firsts if f.done() and f.exception() is not None), None)
        if refused is not None:
            await _closed(firsts, streams)
            if isinstance(refused, TritonError):
                raise triton_error(refused, guide) from None
            raise refused
        return [first.result() for first in firsts], streams

    def chat_turn(self, body: dict, renames: Renames,
                  generate: bool = True) -> tuple[str, Choice | None, str | None]:
        """A request of another API translated to a chat request (`body`), checked and built as chat's:
        its rendered prompt, its one choice (None unless `generate`) and the parameter that asked for
        its guide (named where the model refuses it). Refusals name that API's parameters (`renames`)."""
        try:
            chat = parse(ChatRequest, body)
            tools = check_tools(chat, self.model.tool_parser)
            prompt, start = self.chat_prompt(chat, check_chat(chat, self.model.vocab_size), tools)
            run = self.choices_of(chat, [prompt], True, None, tools, start)[0] if generate else None
        except ApiError as exc:
            raise renamed(exc, renames) from None
        guide = self.guide_param(chat, tools)
        return prompt, run, None if guide is None else rename(guide, renames)

    async def texts(self, request: Request, runs: list[Choice], guide: str | None) -> list[str]:
        """Each choice's whole text, their Triton requests in flight together."""
        async def collect(run: Choice) -> str:
            text = ""
            async for step in self.triton.generate(run.gen):
                text += run.take(step)
            return text

        each = [asyncio.ensure_future(collect(run)) for run in runs]
        try:
            return await unless_gone(request, asyncio.gather(*each))
        except TritonError as exc:
            raise triton_error(exc, guide) from None
        finally:
            for one in each:  # one prompt refused: the others' Triton requests end too
                one.cancel()

    async def whole_segments(self, request: Request, run: Choice, guide: str | None,
                             segments: Segments) -> str:
        """The one choice's whole answer as `segments`; its status (incomplete: the limit ran out)."""
        (text,) = await self.texts(request, [run], guide)
        segments.scored(run.logprobs_body())
        segments.push(run.deltas(text, final=True))
        status = run.status()
        segments.close(status)
        return status
