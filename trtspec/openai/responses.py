"""OpenAI's Responses API (`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`), as
trtllm-serve and vLLM serve it for open models: a thin layer over the chat path.

A request becomes a chat request (`chat_body`): `instructions` a system message first, `input`
(a text, or items: messages, `function_call`s and their `function_call_output`s, `reasoning`)
the conversation, the flat function `tools` and `tool_choice` chat's, `text.format` a
`response_format`, `max_output_tokens` the completion's limit. It is then checked, guided,
generated and parsed exactly as /v1/chat/completions does, so its text is the chat answer's, and
the chat answer's deltas (`reasoning_content`, `content`, `tool_calls`) become output items
(`OutputItems`): a `reasoning` item (with the server's --reasoning-parser, its text whole in
`content`, no summary), a `message` with one `output_text`, a `function_call` per tool call.
Streamed, the same items are built by OpenAI's events (`response.created`, `.in_progress`,
`.output_item.added`, `.content_part.added`, `.output_text.delta`, `.reasoning_text.delta`,
`.function_call_arguments.delta`, their `.done`s, then `response.completed`, or
`response.incomplete` when `max_output_tokens` ran out), each with its `sequence_number`; the
whole answer is its stream's items.

A response is stored (`store`, true by default as in OpenAI's API) in the server's memory, the
last STORE_CAPACITY of them: `previous_response_id` continues its conversation (its input and
output; its instructions are not carried over, as OpenAI's are not), `GET` returns it (and
`/input_items` its request's input, `item_page`), `DELETE` drops it. Function tools are strict
unless they say otherwise, as in OpenAI's Responses API (a strict tool's calls follow its schema:
tools.py).

A `background` response (stored) is answered at once, `queued`, and generated apart from the
request that made it (`Background`): `GET` shows it as it stands (queued, in_progress, then
completed, incomplete, failed or cancelled), `POST /v1/responses/{id}/cancel` stops it, and its
events are kept, so `GET /v1/responses/{id}?stream=true&starting_after=N` streams them from the
one after sequence number N, following the live ones to its end; a client that leaves its stream
leaves the response running. Its events stay while it is stored (one a token, some 200 bytes each).
"""

from __future__ import annotations

import asyncio
import copy
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple, TypeVar

from pydantic import Field

from trtspec import json_text
from trtspec.openai.protocol import (
    ApiError,
    SamplingFields,
    check_cache_retention,
    only_keys,
    refuse,
    renamed,
    required_string,
)
from trtspec.openai.segments import CALL, TEXT, Segment, Segments, named_sse
from trtspec.openai.tools import tool_plan

T = TypeVar("T")  # an attempt's result (longest_fitting)
STORE_CAPACITY = 1000  # responses kept for previous_response_id and GET, the oldest dropped first
TEXT_FORMATS = ("text", "json_object", "json_schema")
ROLES = ("user", "system", "developer", "assistant")
LOGPROBS = "message.output_text.logprobs"  # `include`d: the message text's tokens' log-probabilities
# accepted: reasoning is sent in plain text anyway
INCLUDABLE = ("reasoning.encrypted_content", LOGPROBS)
# hosted tools accepted and not offered to the model: OpenAI runs them, trtspec has none to run (Codex
# declares web search in every request); a model may always choose to call no tool
UNOFFERED = ("web_search", "web_search_preview")


class ResponsesRequest(SamplingFields):
    """`POST /v1/responses`. Besides OpenAI's fields, the sampling parameters chat takes (`top_k`,
    `min_p`, `seed`, `stop`, penalties, `logit_bias`, …, vLLM's extensions) and
    `chat_template_kwargs`."""

    model: str = Field(description="served model name")
    input: str | list = Field(description="a user message's text, or a list of items: messages ({role, "
                              "content}), function_call, function_call_output, reasoning")
    instructions: str | None = Field(None, description="a system message before the input (not carried "
                                     "to a next response)")
    max_output_tokens: int | None = Field(None, description="most tokens to generate, reasoning included")
    tools: list | None = Field(None, description='function tools: [{"type": "function", "name", '
                               '"description", "parameters", "strict"}], strict unless "strict": false')
    tool_choice: Any = Field(None, description='"none", "auto" (the default with tools), "required" or '
                             '{"type": "function", "name"}')
    parallel_tool_calls: bool | None = Field(None, description="false: at most one tool call")
    text: dict | None = Field(None, description='{"format": {"type": "text"}, {"type": "json_object"} or '
                              '{"type": "json_schema", "name", "schema", "strict"}}')
    reasoning: dict | None = Field(None, description='{"effort", "summary"}: effort as chat\'s '
                                   'reasoning_effort (the chat template\'s variable); summary accepted (no '
                                   'summaries: the reasoning comes whole)')
    stream: bool | None = Field(False, description="server-sent events as OpenAI's Responses streams them")
    stream_options: dict | None = Field(None, description='{"include_obfuscation"}: accepted, not used')
    store: bool | None = Field(True, description="keep the response for previous_response_id and GET")
    previous_response_id: str | None = Field(None, description="continue a stored response's conversation")
    metadata: dict | None = Field(None, description="returned with the response")
    include: list[str] | None = Field(None, description='"message.output_text.logprobs": each token of the '
                                      'message\'s text with its log-probability (the target\'s raw log p); '
                                      '"reasoning.encrypted_content" accepted (nothing is encrypted: '
                                      'reasoning comes as text)')
    truncation: str | None = Field(None, description='"disabled" (the default: a conversation past the '
                                   'context is a 400) or "auto" (its oldest turns dropped until it fits)')
    service_tier: str | None = Field(None, description="accepted, one tier")
    prompt_cache_key: str | None = Field(None, description="accepted: prefixes are reused by their tokens")
    prompt_cache_retention: str | None = Field(
        None, description='"in_memory" or "24h", a maximum: accepted (a prefix is kept while a decoder slot '
                          "holds it, `limits.prefix_reuse`)")
    safety_identifier: str | None = Field(None, description="accepted, not used")
    client_metadata: dict | None = Field(None, description="accepted, not used (Codex's per-turn ids)")
    top_logprobs: int | None = Field(None, description='with include "message.output_text.logprobs": the 0 '
                                     'to 20 most likely tokens at each position too')
    max_tool_calls: int | None = Field(None, description="not served")
    background: bool | None = Field(None, description="answer at once (queued) and generate apart from the "
                                    "request: read it with GET, stream it with GET ?stream=true, cancel it "
                                    "(needs store)")
    conversation: Any = Field(None, description='a conversation\'s id (or {"id"}; conversations.py): its '
                              'items come before the input, the response\'s input and output are added to it')
    prompt: Any = Field(None, description="not served (OpenAI's stored prompt templates)")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="variables for the chat template, e.g. Qwen3's enable_thinking (vLLM extension)")
    thinking_token_budget: int | None = Field(
        None, description="most tokens in the reasoning block, then its end is forced (needs the server's "
                          "--reasoning-parser; TensorRT-LLM extension)")


def check_responses(req: ResponsesRequest) -> None:
    """Refuse by name what trtspec does not serve of a Responses request."""
    if req.background and req.store is False:
        raise ApiError("Invalid 'background': a background response is stored, to be read with GET; leave "
                       "'store' out or send true.", "background", code="invalid_value")
    check_cache_retention(req.prompt_cache_retention)
    if req.conversation is not None and req.previous_response_id is not None:
        raise ApiError("Mutually exclusive parameters: 'previous_response_id' and 'conversation'; a response "
                       "continues one or the other.", "previous_response_id", code="invalid_value")
    refused = (("prompt", req.prompt is not None, "stored prompt templates are OpenAI's; send 'input'"),
               ("max_tool_calls", req.max_tool_calls is not None, "send 'parallel_tool_calls': false for at "
                "most one call"))
    for param, bad, why in refused:
        if bad:
            raise refuse(param, getattr(req, param), why)
    if req.truncation not in (None, "disabled", "auto"):
        raise ApiError(f"Invalid 'truncation': {req.truncation!r}; expected auto or disabled.", "truncation",
                       code="invalid_value")
    for k, item in enumerate(req.include or ()):
        if item not in INCLUDABLE:
            raise refuse(f"include[{k}]", item, f"only {LOGPROBS!r} and 'reasoning.encrypted_content' "
                          "(accepted: reasoning comes as text)")
    if req.top_logprobs and not logprobs_included(req):
        raise ApiError(f"'top_logprobs' needs 'include': [{LOGPROBS!r}].", "top_logprobs",
                       code="invalid_value")
    if req.stream_options is not None:
        if not req.stream:
            raise ApiError("Invalid 'stream_options': only allowed when 'stream' is true.", "stream_options",
                           code="invalid_value")
        only_keys(req.stream_options, ("include_obfuscation",), "stream_options")
    reasoning = req.reasoning or {}
    only_keys(reasoning, ("effort", "summary", "generate_summary"), "reasoning")
    text = req.text or {}
    only_keys(text, ("format", "verbosity"), "text")
    if text.get("verbosity") not in (None, "medium"):
        raise refuse("text.verbosity", text["verbosity"], "the model has no verbosity setting")


def logprobs_included(req: ResponsesRequest) -> bool:
    return LOGPROBS in (req.include or ())


# -- the request as a chat request

def chat_body(req: ResponsesRequest, conversation: list[dict]) -> dict:
    """The chat request (a /v1/chat/completions body) `req` asks for (streamed in the background too:
    its text as it comes, for GET and its events): its instructions, then `conversation` (chat
    messages: a stored response's, then `input_messages` of the request's input); parse it as a
    ChatRequest and name its refusals with `renamed`."""
    messages = [{"role": "system", "content": req.instructions}] if req.instructions is not None else []
    messages += conversation
    body = req.model_dump(include=set(SamplingFields.model_fields), exclude_unset=True)
    tools, choice = chat_tools(req.tools), chat_tool_choice(req.tool_choice)
    if tools is None and choice in ("auto", "none"):  # only unoffered tools: the model is offered none
        choice = None
    body |= {"model": req.model, "messages": messages, "stream": bool(req.stream or req.background),
             "max_completion_tokens": req.max_output_tokens, "tools": tools,
             "tool_choice": choice, "parallel_tool_calls": req.parallel_tool_calls,
             "response_format": response_format((req.text or {}).get("format")),
             "chat_template_kwargs": req.chat_template_kwargs,
             "reasoning_effort": (req.reasoning or {}).get("effort"),
             "logprobs": logprobs_included(req) or None,
             "top_logprobs": req.top_logprobs if logprobs_included(req) else None,
             "thinking_token_budget": req.thinking_token_budget}
    return {name: value for name, value in body.items() if value is not None}


ITEM_STATUSES = ("in_progress", "completed", "incomplete")  # an input item's `status`, as OpenAI's


def input_messages(given: str | list, param: str = "input", calls: set[str] | None = None) -> list[dict]:
    """Responses input items as chat messages: a message item's text parts joined one a line, a
    function_call joined to the assistant message before it (or a new one; one of status incomplete,
    cut short by max_output_tokens or a stop sequence, was never made and is left out), a
    function_call_output a tool message, a reasoning item's text the next assistant message's
    reasoning_content. Given `calls` (the call ids the conversation made before `given`, as `calls_made`
    reads them), a function_call_output must answer one of those or a function_call before it, as
    OpenAI requires (not one cut short: it was never made); `calls` gains `given`'s."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    messages: list[dict] = []
    reasoning: str | None = None  # a reasoning item's, for the assistant message that follows it
    cut_short: set[str] = set()  # the ids of the calls of status incomplete, left out

    def assistant() -> dict:
        nonlocal reasoning
        message = {"role": "assistant", "content": ""}
        if reasoning is not None:
            message["reasoning_content"], reasoning = reasoning, None
        messages.append(message)
        return message

    for i, item in enumerate(given):
        where = f"{param}[{i}]"
        if not isinstance(item, dict):
            raise ApiError(f"Invalid '{where}': expected an item object like {{\"role\": \"user\", "
                           "\"content\": \"...\"}.", where, code="invalid_type")
        if item.get("id") is not None:  # kept and echoed: OpenAI's ids are strings
            required_string(item, "id", where)
        if item.get("status") is not None and item["status"] not in ITEM_STATUSES:
            raise ApiError(f"Invalid value for '{where}.status': {item['status']!r}; expected one of "
                           f"{', '.join(ITEM_STATUSES)}.", f"{where}.status", code="invalid_value")
        kind = item.get("type", "message")
        if kind == "message":
            only_keys(item, ("type", "role", "content", "id", "status", "phase"), where)
            role = item.get("role")
            if role not in ROLES:
                raise ApiError(f"Invalid value for '{where}.role': {role!r}; expected one of "
                               f"{', '.join(ROLES)}.", f"{where}.role", code="invalid_value")
            content = _message_text(item.get("content"), f"{where}.content")
            if role == "assistant":
                assistant()["content"] = content
            else:
                messages.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind == "function_call":
            only_keys(item, ("type", "call_id", "name", "arguments", "id", "status", "namespace"), where)
            for field in ("call_id", "name", "arguments"):
                required_string(item, field, where)
            if item.get("status") == "incomplete":  # its arguments' text is what came before the cut
                cut_short.add(item["call_id"])
                continue
            if calls is not None:
                calls.add(item["call_id"])
            try:
                arguments = json_text.loads(item["arguments"])
            except ValueError as exc:
                raise ApiError(f"Invalid '{where}.arguments': not JSON ({exc}).", f"{where}.arguments",
                               code="invalid_value") from None
            if not isinstance(arguments, dict):
                raise ApiError(f"Invalid '{where}.arguments': expected a JSON object's text.",
                               f"{where}.arguments", code="invalid_value")
            last = messages[-1] if messages and reasoning is None else None
            message = last if last is not None and last["role"] == "assistant" else assistant()
            name = item["name"] if item.get("namespace") is None else f"{item['namespace']}.{item['name']}"
            message.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function", "function": {"name": name,
                                                                       "arguments": item["arguments"]}})
        elif kind == "function_call_output":
            only_keys(item, ("type", "call_id", "output", "id", "status"), where)
            required_string(item, "call_id", where)
            if calls is not None and item["call_id"] in cut_short - calls:
                raise ApiError(f"Invalid '{where}': function call {item['call_id']} was cut short (status "
                               "incomplete) and never made, so nothing answers it; leave its output out.",
                               where, code="invalid_value")
            if calls is not None and item["call_id"] not in calls:  # OpenAI's words
                raise ApiError(f"No tool call found for function call output with call_id {item['call_id']} "
                               f"(in '{param}'): send the function_call it answers before it, or continue "
                               "the response that made it (previous_response_id).", param,
                               code="invalid_value")
            output = _message_text(item.get("output"), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "reasoning":
            only_keys(item, ("type", "id", "summary", "content", "encrypted_content", "status"), where)
            if item.get("encrypted_content") is not None:
                raise refuse(f"{where}.encrypted_content", "...", "trtspec encrypts no reasoning; send its "
                              "'content' as this server gave it")
            parts = item.get("content") or []
            if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                                       for p in parts):
                raise ApiError(f"Invalid '{where}.content': expected a list of {{\"type\": "
                               "\"reasoning_text\", \"text\"}} parts.", f"{where}.content",
                               code="invalid_value")
            reasoning = (reasoning or "") + "".join(p["text"] for p in parts)
        else:
            raise refuse(f"{where}.type", kind, "an input item is a message, function_call, "
                          "function_call_output or reasoning (no item_reference: send the items themselves)")
    if reasoning is not None:  # reasoning last: an assistant turn of reasoning alone
        assistant()
    if not given:
        raise ApiError(f"'{param}' must hold at least one item.", param, code="invalid_value")
    return messages


def calls_made(messages: list[dict]) -> set[str]:
    """The ids of the tool calls chat messages make (their assistant messages' `tool_calls`)."""
    return {call["id"] for message in messages for call in message.get("tool_calls", ())}


def truncation_cuts(messages: list[dict]) -> list[int]:
    """Where `truncation: "auto"`'s candidates begin, longest first: 0 (the conversation whole), then
    each message that begins a turn after the first, so the oldest turns are dropped one at a time
    down to the last. A turn is a user message and what follows it up to the next (the assistant's
    answer, its tool calls and their results); no cut parts a tool result from its call (a cut
    between them, where a user message came between, is skipped). `truncated` makes a candidate."""
    made = {call["id"]: i for i, message in enumerate(messages) for call in message.get("tool_calls", ())}
    opened = [0] * (len(messages) + 1)  # a call at i answered at j: no cut in (i, j] (as differences)
    for j, message in enumerate(messages):
        i = made.get(message.get("tool_call_id")) if message["role"] == "tool" else None
        if i is not None and i < j:
            opened[i + 1] += 1
            opened[j + 1] -= 1
    cuts, begun, parted = [0], False, 0
    for cut, message in enumerate(messages):
        parted += opened[cut]
        if message["role"] == "user" and begun and not parted:
            cuts.append(cut)
        begun = begun or message["role"] != "system"
    return cuts


def truncated(messages: list[dict], cut: int) -> list[dict]:
    """The conversation from message `cut` on (a `truncation_cuts` cut), its system messages before
    it (instructions, developer messages) kept where they stand."""
    return messages if cut == 0 else [m for i, m in enumerate(messages) if i >= cut or m["role"] == "system"]


def longest_fitting(count: int, attempt: Callable[[int], T | None]) -> tuple[int, T]:
    """(k, attempt(k)) for the first of `count` candidates, longest first, that fits: `attempt(k)` is
    None where candidate k overflows the context (the last's raises instead). A candidate shorter
    than one that fits fits too, so bisection finds it in about log2(count) attempts; one attempt
    (a rendering and tokenization of the conversation) per candidate took 116 s for 3,200 turns,
    the frontend answering no one meanwhile."""
    if (got := attempt(0)) is not None:
        return 0, got
    fits, best = count - 1, attempt(count - 1)  # candidate 0 does not fit
    overflows = 0
    while fits - overflows > 1:
        middle = (overflows + fits) // 2
        if (got := attempt(middle)) is None:
            overflows = middle
        else:
            fits, best = middle, got
    return fits, best


def _message_text(content, param: str) -> str:
    """A message's (or a function call output's) content as text: a string, or text parts joined one
    a line (input_text, output_text), as chat joins its parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(f"Invalid '{param}': expected a string or a list of content parts like "
                       "{\"type\": \"input_text\", \"text\": \"...\"}.", param, code="invalid_type")
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text"):
            raise ApiError(f"Invalid value for '{param}': part {k} is of type {kind!r}; only text parts "
                           "(input_text, output_text) are supported by trtspec.", f"{param}[{k}].type",
                           code="unsupported_value")
        texts.append(required_string(part, "text", f"{param}[{k}]"))
    return "\n".join(texts)


def chat_tools(tools: list | None) -> list | None:
    """Responses' tools as chat's function tools: flat function tools strict unless they say
    otherwise (OpenAI's default in the Responses API); a namespace's functions each as
    `NAMESPACE.NAME` (`namespaced`), the namespace's description before its own; OpenAI's hosted
    web search (`UNOFFERED`) left out. Checked as chat checks them (tools.py), a refusal named by
    the Responses tool it came from. None: no function tools."""
    if tools is None:
        return None
    out, origin = [], []  # each chat tool, and where in the request it came from
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ApiError(f"Invalid '{where}': expected an object like {{\"type\": \"function\", \"name\": "
                           "...}.", where, code="invalid_type")
        kind = tool.get("type")
        if kind in UNOFFERED:  # OpenAI runs it, trtspec does not: the model is not offered it
            continue
        if kind == "namespace":
            only_keys(tool, ("type", "name", "description", "tools"), where)
            space, inner = tool.get("name"), tool.get("tools")
            if not isinstance(space, str) or not isinstance(inner, list) or not inner:
                raise ApiError(f"Invalid '{where}': a namespace has a 'name' and a list of function 'tools'.",
                               where, code="invalid_value")
            for j, function in enumerate(inner):
                out.append(_chat_tool(function, f"{where}.tools[{j}]", space, tool.get("description")))
                origin.append(f"{where}.tools[{j}]")
        elif kind == "function":
            out.append(_chat_tool(tool, where))
            origin.append(where)
        else:
            raise refuse(f"{where}.type", kind, "function and namespace tools only (file search, MCP and "
                          "the others are OpenAI's hosted tools; web search is accepted and not offered)")
    try:
        tool_plan(out, "none", None, None)  # as chat checks them, named by the Responses tool
    except ApiError as exc:
        raise renamed(exc, tuple((re.compile(rf"\btools\[{k}\]\.function\b"), at)
                                 for k, at in enumerate(origin))) from None
    return out or None


def _chat_tool(tool, where: str, space: str | None = None, about: str | None = None) -> dict:
    """A Responses function tool as chat's (in namespace `space`, described by `about`)."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise refuse(f"{where}.type", tool.get("type") if isinstance(tool, dict) else tool, "a function tool")
    only_keys(tool, ("type", "name", "description", "parameters", "strict"), where)
    function = {key: value for key, value in tool.items() if key != "type" and value is not None}
    if space is not None:
        required_string(function, "name", where)  # checked here: "fs.None" would pass as a name
        function["name"] = f"{space}.{function['name']}"
        if about:
            function["description"] = f"{about} {function.get('description', '')}".strip()
    return {"type": "function", "function": {"strict": True, **function}}


def namespaced(tools: list | None) -> dict[str, tuple[str, str]]:
    """Each namespaced function's chat name -> (namespace, its name), for the calls' items."""
    return {f"{tool['name']}.{function['name']}": (tool["name"], function["name"])
            for tool in tools or () if isinstance(tool, dict) and tool.get("type") == "namespace"
            for function in tool.get("tools") or ()}


def chat_tool_choice(choice):
    """Responses' tool_choice as chat's: {"type": "function", "name"} names a function."""
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        only_keys(choice, ("type", "name"), "tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if isinstance(choice, dict) and kind not in (None, "function"):
        raise refuse("tool_choice.type", kind, "a function tool only")
    raise ApiError("Invalid 'tool_choice': expected none, auto, required or {\"type\": \"function\", "
                   "\"name\": ...}.", "tool_choice", code="invalid_value")


def response_format(fmt) -> dict | None:
    """`text.format` as chat's response_format."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise ApiError("Invalid type for 'text.format': expected an object.", "text.format",
                       code="invalid_type")
    kind = fmt.get("type")
    if kind not in TEXT_FORMATS:
        raise ApiError(f"Invalid 'text.format.type': {kind!r}; expected {', '.join(TEXT_FORMATS)}.",
                       "text.format.type", code="invalid_value")
    if kind != "json_schema":
        only_keys(fmt, ("type",), "text.format")
        return {"type": kind}
    only_keys(fmt, ("type", "name", "schema", "strict", "description"), "text.format")
    if not isinstance(fmt.get("schema"), dict):
        raise ApiError("'text.format.schema' must be a JSON schema object.", "text.format.schema",
                       code="invalid_value")
    return {"type": "json_schema", "json_schema": {key: fmt[key] for key in ("name", "schema") if key in fmt}}


# chat's parameter names as a Responses request names them (`renamed`)
RENAMES = ((re.compile(r"\bmax_completion_tokens\b"), "max_output_tokens"),
           (re.compile(r"\breasoning_effort\b"), "reasoning.effort"),
           (re.compile(r"\btools\[(\d+)\]\.function\b"), r"tools[\1]"),
           (re.compile(r"\btool_choice\.function\b"), "tool_choice"),
           (re.compile(r"\bresponse_format\.json_schema\b"), "text.format"),
           (re.compile(r"\bresponse_format\b"), "text.format"),
           (re.compile(r"\blogprobs\b"), "include"),
           # a message's index is not its item's (instructions, merged calls): the input as a whole
           (re.compile(r"\bmessages(\[\d+\](\.\w+|\[\d+\])*)?"), "input"))


# -- the answer as output items and events

def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputItems(Segments):
    """One chat answer's segments as a response's output items (`items`), and the streaming events
    that build them, numbered in order (`event`)."""

    def __init__(self, namespaced: dict[str, tuple[str, str]] | None = None):
        super().__init__()
        self.items: list[dict] = []  # a segment's item at its index
        self.sequence = 0
        self.namespaced = namespaced or {}  # a namespaced function's chat name -> (namespace, name)
        self.scores: list[dict] = []  # tokens' log-probabilities not yet given to the text they wrote

    def scored(self, logprobs: dict | None) -> None:
        if logprobs is not None:
            self.scores += logprobs["content"]

    def event(self, kind: str, **fields) -> dict:
        out = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return out

    def started(self, segment: Segment) -> list[dict]:
        if segment.kind == CALL:
            item = {"id": _id("fc"), "type": "function_call", "status": "in_progress",
                    "call_id": segment.call_id, "name": segment.name, "arguments": ""}
            if segment.name in self.namespaced:
                item["namespace"], item["name"] = self.namespaced[segment.name]
        elif segment.kind == TEXT:
            item = {"id": _id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                    "content": []}
        else:
            item = {"id": _id("rs"), "type": "reasoning", "status": "in_progress", "summary": [],
                    "content": []}
        self.items.append(item)
        events = [self.event("response.output_item.added", output_index=segment.index,
                             item=copy.deepcopy(item))]  # as it stands now
        if segment.kind != CALL:  # its one part: the text, or the reasoning
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []} \
                if segment.kind == TEXT else {"type": "reasoning_text", "text": ""}
            item["content"].append(part)
            events.append(self.event("response.content_part.added", item_id=item["id"],
                                     output_index=segment.index, content_index=0, part=copy.deepcopy(part)))
        return events

    def extended(self, segment: Segment, text: str) -> list[dict]:
        item = self.items[segment.index]
        at = {"item_id": item["id"], "output_index": segment.index}
        if segment.kind == CALL:
            item["arguments"] = segment.text
            return [self.event("response.function_call_arguments.delta", **at, delta=text)]
        item["content"][0]["text"] = segment.text
        if segment.kind == TEXT:
            scores, self.scores = self.scores, []
            item["content"][0]["logprobs"] += scores
            return [self.event("response.output_text.delta", **at, content_index=0, delta=text,
                               logprobs=scores)]
        return [self.event("response.reasoning_text.delta", **at, content_index=0, delta=text)]

    def ended(self, segment: Segment, status: str) -> list[dict]:
        item = self.items[segment.index]
        if segment.kind == CALL:  # whole when its arguments are (a limit or stop sequence may cut them)
            status = "completed" if _json_object(item["arguments"]) else "incomplete"
        item["status"] = status
        at = {"item_id": item["id"], "output_index": segment.index}
        if segment.kind == CALL:
            events = [self.event("response.function_call_arguments.done", **at, name=item["name"],
                                 arguments=item["arguments"])]
        else:
            part = item["content"][0]
            if segment.kind == TEXT:  # tokens whose text was held back, then cut (a stop sequence's)
                part["logprobs"] += self.scores
                self.scores = []
            events = [self.event("response.output_text.done", **at, content_index=0, text=part["text"],
                                 logprobs=part["logprobs"]) if segment.kind == TEXT else
                      self.event("response.reasoning_text.done", **at, content_index=0, text=part["text"]),
                      self.event("response.content_part.done", **at, content_index=0, part=dict(part))]
        return events + [self.event("response.output_item.done", output_index=segment.index, item=item)]


def _json_object(text: str) -> bool:
    try:
        return isinstance(json_text.loads(text), dict)
    except ValueError:
        return False


def response_object(req: ResponsesRequest, rid: str, created: int, model: str, output: list[dict],
                    status: str, usage: dict | None = None, temperature: float | None = None,
                    top_p: float | None = None, error: dict | None = None,
                    conversation: str | None = None) -> dict:
    """The `response` object: its output items, status (in_progress, completed, incomplete, failed)
    and usage, with the request's settings as OpenAI's echoes them (`conversation`: the id of the
    conversation it continues)."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {"id": rid, "object": "response", "created_at": created, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "model": model, "output": output, "error": error, "incomplete_details": incomplete,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id, "temperature": temperature, "top_p": top_p,
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": [{"strict": True, **tool} if tool.get("type") == "function" else tool
                      for tool in req.tools or ()],
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "reasoning": {key: (req.reasoning or {}).get(key) for key in ("effort", "summary")},
            "truncation": req.truncation or "disabled", "store": req.store is not False,
            "background": req.background is True,
            "metadata": req.metadata or {}, "user": req.user, "usage": usage,
            "conversation": None if conversation is None else {"id": conversation}}


def input_items(given: str | list) -> list[dict]:
    """A request's input as the items `GET /v1/responses/{id}/input_items` lists: a text as a user
    message, items as given, each with an id (one given it keeps)."""
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": given}]}]
    prefixes = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
    return [{"id": _id(prefixes.get(item.get("type", "message"), "item")), **item,
             **({"type": "message"} if "type" not in item else {})} for item in given]


def page_of(items: list[dict], query) -> dict:
    """The page of `items` a list request's query asks for (`order`, `after`, `limit`; `item_page`)."""
    limit = query.get("limit", "20")
    if not (limit.isascii() and limit.isdigit()):
        raise ApiError(f"Invalid 'limit': {limit!r}; expected 1 to 100.", "limit", code="invalid_value")
    return item_page(items, query.get("order", "desc"), query.get("after"), int(limit))


def item_page(items: list[dict], order: str, after: str | None, limit: int) -> dict:
    """A page of input items, as OpenAI lists them: newest first by default (`order` desc), from the
    one after the item `after` names, at most `limit` (1 to 100)."""
    if order not in ("asc", "desc"):
        raise ApiError(f"Invalid 'order': {order!r}; expected asc or desc.", "order", code="invalid_value")
    if not 1 <= limit <= 100:
        raise ApiError(f"Invalid 'limit': {limit}; expected 1 to 100.", "limit", code="invalid_value")
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise ApiError(f"Invalid 'after': no item {after!r} in this list.", "after",
                           code="invalid_value")
        ordered = ordered[ids.index(after) + 1:]
    page = ordered[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > limit}


def assistant_messages(output: list[dict]) -> list[dict]:
    """A response's output items as the chat messages that continue its conversation."""
    return input_messages(output, "output") if output else []


FINISHED = ("completed", "incomplete", "failed", "cancelled")  # a response's statuses once it has ended


class Background:
    """A background response's run apart from its request (`task`): its events as they come, each
    encoded at its sequence number (`add`), followed by any number of readers (`follow`); the
    response as it stands (`current`, set by its maker) while it is queued or in progress."""

    def __init__(self, current: Callable[[], dict]):
        self.current = current
        self.events: list[bytes] = []  # server-sent events, at their sequence numbers
        self.status = "queued"
        self.task: asyncio.Task | None = None
        self.ended = False  # the run is over: no event will come
        self._grown = asyncio.Event()  # set (and replaced) when an event comes or the run ends

    def add(self, event: dict) -> None:
        assert event["sequence_number"] == len(self.events), "events are numbered in order"
        self.events.append(named_sse(event))
        self._wake()

    def end(self, status: str) -> None:
        self.status, self.ended = status, True
        self._wake()

    def _wake(self) -> None:
        self._grown.set()
        self._grown = asyncio.Event()

    async def follow(self, after: int = -1) -> AsyncIterator[bytes]:
        """The events after sequence number `after`, the live ones as they come, to the run's end."""
        k = max(after + 1, 0)
        while True:
            grown = self._grown
            while k < len(self.events):
                yield self.events[k]
                k += 1
            if self.ended:
                return
            await grown.wait()


class Stored(NamedTuple):
    response: dict  # as it was answered (a background one: as it was queued, until it ends)
    conversation: list[dict] | None  # the chat messages that continue it (its instructions left out);
    #                                  None: it did not finish (in progress, failed, cancelled)
    items: list[dict]  # its request's input items (`input_items`)
    background: Background | None = None  # a background response's run and events

    def now(self) -> dict:
        """The response as it stands."""
        job = self.background
        return job.current() if job is not None and not job.ended else self.response


class ResponseStore:
    """The last `capacity` stored responses."""

    def __init__(self, capacity: int = STORE_CAPACITY):
        self.capacity = capacity
        self._kept: OrderedDict[str, Stored] = OrderedDict()

    def put(self, response: dict, conversation: list[dict] | None, items: list[dict],
            background: Background | None = None) -> None:
        self._kept[response["id"]] = Stored(response, conversation, items, background)
        while len(self._kept) > self.capacity:
            _, dropped = self._kept.popitem(last=False)
            if dropped.background is not None and dropped.background.task is not None:
                dropped.background.task.cancel()  # a run nobody can read any more

    def ended(self, response: dict, conversation: list[dict] | None) -> None:
        """A background response's end: stored as it ended, unless it was deleted (or dropped)."""
        kept = self._kept.get(response["id"])
        if kept is not None:
            self._kept[response["id"]] = kept._replace(response=response, conversation=conversation)

    def get(self, rid: str, param: str | None = None) -> Stored:
        if rid not in self._kept:
            what = "Previous response" if param else "Response"
            raise ApiError(f"{what} with id '{rid}' not found (responses are kept in this server's memory, "
                           f"the last {self.capacity}, when 'store' is not false).", param, status=404,
                           code="not_found")
        return self._kept[rid]

    def conversation(self, rid: str) -> list[dict]:
        """The conversation a response continued by `previous_response_id` ends in."""
        kept = self.get(rid, "previous_response_id")
        if kept.conversation is None:
            raise ApiError(f"Invalid 'previous_response_id': response '{rid}' is {kept.now()['status']}; "
                           "continue a completed or incomplete response.", "previous_response_id",
                           code="invalid_value")
        return kept.conversation

    def delete(self, rid: str) -> None:
        kept = self.get(rid)
        if kept.background is not None and kept.background.task is not None:
            kept.background.task.cancel()
        del self._kept[rid]
