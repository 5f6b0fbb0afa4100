"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), as
trtllm-serve and vLLM serve it for open models, so Anthropic's SDKs and the agents built on them
(Claude Code's `ANTHROPIC_BASE_URL`) reach a trtspec deployment: a thin layer over the chat path.

A request becomes a chat request (`chat_body`): `system` a system message first, `messages`
the conversation (text blocks, the assistant's `tool_use` blocks as tool calls and `thinking`
blocks as its reasoning, the user's `tool_result` blocks as tool messages), `tools` function
tools (`input_schema` their parameters), `tool_choice` chat's (`any` is "required", `tool` names
one), `thinking` the chat template's `enable_thinking` (Qwen3's), `output_config.format` a
json_schema response_format, `output_config.effort` chat's reasoning_effort (the template's
variable), `stop_sequences` chat's stop. It is checked, guided, generated and
parsed exactly as /v1/chat/completions does, and the chat answer's segments become content
blocks (`ContentBlocks`): `thinking` (with the server's --reasoning-parser), `text`, a `tool_use`
per call. Streamed as Anthropic's events: `message_start`, per block `content_block_start`,
`content_block_delta` (`thinking_delta`, `text_delta`, `input_json_delta`) and
`content_block_stop`, then `message_delta` (stop_reason, usage) and `message_stop`. Errors are
Anthropic's `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from typing import Any

from pydantic import Field

from trtspec import json_text
from trtspec.openai.protocol import ApiError, _Forbid, only_keys, refuse, required_string
from trtspec.openai.segments import CALL, TEXT, Segment, Segments

MIN_THINKING_BUDGET = 1024  # Anthropic's least budget_tokens
EFFORTS = ("low", "medium", "high", "xhigh", "max")  # output_config.effort's levels (chat's reasoning_effort)
# Claude Code's first system block: per-request client telemetry ("x-anthropic-billing-header: cc_version=…;
# cc_entrypoint=…;"), no instruction; kept, it would change the prompt's first tokens every request and
# no prefix would ever be reused
BILLING_BLOCK = re.compile(r"x-anthropic-billing-header:\s*(?:[A-Za-z_][\w.-]*=[^;]*;\s*)+")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}  # else api_error


class CountTokensRequest(_Forbid):
    """`POST /v1/messages/count_tokens`: what the prompt of these messages would count."""

    model: str = Field(description="served model name")
    messages: list = Field(description='the conversation: [{"role": "user" | "assistant", "content": a text '
                           'or blocks}]')
    system: str | list | None = Field(None, description="a text, or text blocks, before the conversation")
    tools: list | None = Field(None, description='[{"name", "description", "input_schema"}]')
    tool_choice: dict | None = Field(None, description='{"type": "auto" | "any" | "tool" | "none", "name", '
                                     '"disable_parallel_tool_use"}')
    thinking: dict | None = Field(None, description='{"type": "enabled", "budget_tokens"}, {"type": '
                                  '"adaptive", "display"}, {"type": "between_tools"} or {"type": '
                                  '"disabled"}: the template\'s enable_thinking')
    output_config: dict | None = Field(None, description='{"format": {"type": "json_schema", "schema"}, '
                                        '"effort": the chat template\'s reasoning_effort}')
    cache_control: dict | None = Field(None, description="accepted: every prompt's prefix is reused when it "
                                       "can be, without markers")
    speed: str | None = Field(None, description="accepted, one speed")
    user_profile_id: str | None = Field(None, description="accepted, not used")
    workspace_id: str | None = Field(None, description="accepted, not used")


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`."""

    max_tokens: int = Field(description="most tokens to generate, thinking included")
    stop_sequences: list[str] | None = Field(None, description="texts that end the answer, not sent")
    stream: bool | None = Field(False, description="server-sent events as Anthropic's API streams them")
    # Anthropic's API took these until its models stopped taking sampling parameters; older clients send them
    temperature: float | None = Field(None, description="0 = greedy")
    top_p: float | None = Field(None, description="nucleus mass in (0, 1]")
    top_k: int | None = Field(None, description="keep the k most likely")
    seed: int | None = Field(None, description="trtspec's (Anthropic's API has none): the sampling seed; an "
                             "answer's trtspec.seed given back samples its text again")
    metadata: dict | None = Field(None, description='{"user_id"}: accepted, not used')
    service_tier: str | None = Field(None, description="accepted, one tier")
    inference_geo: str | None = Field(None, description="accepted, one place")
    diagnostics: dict | None = Field(None, description="accepted, none reported")
    context_management: dict | None = Field(None, description='{"edits": [clear_thinking edits]}: accepted '
                                            "(the chat template decides which earlier thinking the model "
                                            "sees); other edits not served")
    container: Any = Field(None, description="not served (Anthropic's code execution)")
    mcp_servers: list | None = Field(None, description="not served (Anthropic's MCP connector)")


def check_messages_request(req: MessagesRequest) -> None:
    """Refuse by name what trtspec does not serve of a Messages request."""
    for param, why in (("container", "Anthropic's code execution is not served"),
                       ("mcp_servers", "connect MCP tools in the client, as function tools")):
        if getattr(req, param) not in (None, [], {}):
            raise refuse(param, getattr(req, param), why)
    _check_context_management(req.context_management)
    if req.temperature is not None and not 0 <= req.temperature <= 1:  # chat's range is [0, 2]
        raise ApiError(f"Invalid 'temperature': {req.temperature}; expected 0 to 1.", "temperature",
                       code="invalid_value")
    if req.metadata is not None:  # accepted, not used, but as Anthropic types it
        only_keys(req.metadata, ("user_id",), "metadata")
        user = req.metadata.get("user_id")
        if user is not None and not isinstance(user, str):
            raise ApiError("Invalid type for 'metadata.user_id': expected a string.", "metadata.user_id",
                           code="invalid_type")


def _optional_bool(obj: dict, key: str, at: str) -> None:
    if obj.get(key) is not None and not isinstance(obj[key], bool):
        raise ApiError(f"Invalid type for '{at}.{key}': expected a boolean.", f"{at}.{key}",
                       code="invalid_type")


def _check_context_management(given: dict | None) -> None:
    """Context editing (Claude Code sends `clear_thinking` in every request): a clear_thinking edit
    is accepted, since which earlier turns' thinking the model sees is the chat template's to say
    (Qwen3's keeps none of it), as for any open model; an edit that would clear tool results or
    compact the conversation is refused by name."""
    if given is None:
        return
    only_keys(given, ("edits",), "context_management")
    edits = given.get("edits") or []
    if not isinstance(edits, list):
        raise ApiError("Invalid 'context_management.edits': expected a list.", "context_management.edits",
                       code="invalid_type")
    for k, edit in enumerate(edits):
        kind = edit.get("type") if isinstance(edit, dict) else None
        if not (isinstance(kind, str) and kind.startswith("clear_thinking_")):
            raise refuse(f"context_management.edits[{k}].type", kind, "only clear_thinking edits: the "
                         "conversation is sent whole, and the chat template decides which earlier thinking "
                         "the model sees")


# -- the request as a chat request

def chat_body(req: CountTokensRequest) -> dict:
    """The chat request (a /v1/chat/completions body) `req` asks for; parse it as a ChatRequest and
    name its refusals with `protocol.renamed(exc, RENAMES)`."""
    body: dict[str, Any] = {"model": req.model, "messages": chat_messages(req.system, req.messages),
                            "tools": chat_tools(req.tools)}
    choice = req.tool_choice
    if choice is not None:
        only_keys(choice, ("type", "name", "disable_parallel_tool_use"), "tool_choice")
        kind = choice.get("type")
        if kind not in ("auto", "any", "tool", "none"):
            raise ApiError(f"Invalid 'tool_choice.type': {kind!r}; expected auto, any, tool or none.",
                           "tool_choice.type", code="invalid_value")
        if kind == "tool" and not isinstance(choice.get("name"), str):
            raise ApiError("Missing required parameter: 'tool_choice.name' (tool_choice type 'tool').",
                           "tool_choice.name", code="missing_required_parameter")
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or \
            {"type": "function", "function": {"name": choice["name"]}}
        _optional_bool(choice, "disable_parallel_tool_use", "tool_choice")
        if choice.get("disable_parallel_tool_use") is True:
            body["parallel_tool_calls"] = False
    if req.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": _thinking(req)}
        if req.thinking.get("display") == "omitted":  # thought, not sent
            body["include_reasoning"] = False
    if req.output_config is not None:
        body["response_format"] = _output_format(req.output_config)
        body["reasoning_effort"] = req.output_config.get("effort")  # the chat template's variable
    if isinstance(req, MessagesRequest):
        body |= {"max_completion_tokens": req.max_tokens, "stop": req.stop_sequences,
                 "stream": bool(req.stream), "temperature": req.temperature, "top_p": req.top_p,
                 "top_k": req.top_k, "seed": req.seed,  # the block's end forced once it holds budget_tokens
                 "thinking_token_budget": (req.thinking or {}).get("budget_tokens")}
    return {name: value for name, value in body.items() if value is not None}


def _thinking(req: CountTokensRequest) -> bool:
    """Whether `thinking` asks the model to think (its budget checked as Anthropic checks it)."""
    thinking = req.thinking
    only_keys(thinking, ("type", "budget_tokens", "display"), "thinking")
    kind = thinking.get("type")
    if kind not in ("enabled", "adaptive", "between_tools", "disabled"):
        raise ApiError(f"Invalid 'thinking.type': {kind!r}; expected enabled, adaptive, between_tools or "
                       "disabled.", "thinking.type", code="invalid_value")
    if thinking.get("display") not in (None, "summarized", "omitted"):
        raise ApiError(f"Invalid 'thinking.display': {thinking['display']!r}; expected summarized or "
                       "omitted.", "thinking.display", code="invalid_value")
    budget = thinking.get("budget_tokens")
    if kind == "enabled":
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < MIN_THINKING_BUDGET:
            raise ApiError(f"Invalid 'thinking.budget_tokens': {budget!r}; expected an integer of at least "
                           f"{MIN_THINKING_BUDGET}.", "thinking.budget_tokens", code="invalid_value")
        if isinstance(req, MessagesRequest) and budget >= req.max_tokens:
            raise ApiError(f"'thinking.budget_tokens' ({budget}) must be less than 'max_tokens' "
                           f"({req.max_tokens}).", "thinking.budget_tokens", code="invalid_value")
    elif budget is not None:
        raise ApiError(f"'thinking.budget_tokens' belongs to thinking type 'enabled', not {kind!r}.",
                       "thinking.budget_tokens", code="invalid_value")
    return kind != "disabled"


def _output_format(config) -> dict | None:
    only_keys(config, ("format", "effort"), "output_config")
    if config.get("effort") not in (None, *EFFORTS):
        raise ApiError(f"Invalid 'output_config.effort': {config['effort']!r}; expected one of "
                       f"{', '.join(EFFORTS)}.", "output_config.effort", code="invalid_value")
    fmt = config.get("format")
    if fmt is None:
        return None
    only_keys(fmt, ("type", "schema"), "output_config.format")
    if fmt.get("type") != "json_schema":
        raise ApiError(f"Invalid 'output_config.format.type': {fmt.get('type')!r}; expected json_schema.",
                       "output_config.format.type", code="invalid_value")
    if not isinstance(fmt.get("schema"), dict):
        raise ApiError("'output_config.format.schema' must be a JSON schema object.",
                       "output_config.format.schema", code="invalid_value")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def chat_messages(system: str | list | None, messages: list) -> list[dict]:
    """The conversation as chat messages: text blocks one a line; an assistant turn's tool_use
    blocks its tool calls and its thinking its reasoning_content; a user turn's tool_result blocks
    tool messages, in their place among its text (each answering a tool_use of the assistant
    message before it, as Anthropic requires); a system
    message in the conversation (Claude Code's environment notes) a chat system message in its
    place, as the template renders one there (Qwen3's does; a template that refuses it is a 400
    saying so)."""
    out = []
    called: set[str] = set()  # the tool_use ids of the last assistant message
    system = _system_text(system)
    if system:
        out.append({"role": "system", "content": system})
    if not messages:
        raise ApiError("'messages' must hold at least one message.", "messages", code="invalid_value")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        only_keys(message, ("role", "content"), where)
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant", "system"):
            raise ApiError(f"Invalid value for '{where}.role': {role!r}; expected user, assistant or "
                           "system.", f"{where}.role", code="invalid_value")
        if role == "assistant" and (i == 0 or messages[i - 1].get("role") != "assistant"):
            called = set()  # (consecutive assistant messages are one turn, as Anthropic combines them)
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise ApiError(f"Invalid '{where}.content': expected a string or a list of content blocks.",
                           f"{where}.content", code="invalid_type")
        texts: list[str] = []
        turn: dict = {"role": role}  # an assistant turn's calls and reasoning
        for k, block in enumerate(content):
            at = f"{where}.content[{k}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                only_keys(block, ("type", "text", "cache_control", "citations"), at)
                texts.append(required_string(block, "text", at))
            elif kind == "tool_result" and role == "user":
                only_keys(block, ("type", "tool_use_id", "content", "is_error", "cache_control"), at)
                _optional_bool(block, "is_error", at)
                if texts:  # the text before it, in its place
                    out.append({"role": "user", "content": "\n".join(texts)})
                    texts = []
                result = _result_text(block.get("content", ""), f"{at}.content")
                if required_string(block, "tool_use_id", at) not in called:  # Anthropic's words
                    raise ApiError(f"{at}: unexpected `tool_use_id` found in `tool_result` blocks: "
                                   f"{block['tool_use_id']}. Each `tool_result` block must have a "
                                   "corresponding `tool_use` block in the previous assistant message.",
                                   f"{at}.tool_use_id",
                                   code="invalid_value")
                out.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": f"Error: {result}" if block.get("is_error") else result})
            elif kind == "tool_use" and role == "assistant":
                only_keys(block, ("type", "id", "name", "input", "cache_control"), at)
                if not isinstance(block.get("input"), dict):
                    raise ApiError(f"Invalid '{at}.input': expected an object.", f"{at}.input",
                                   code="invalid_value")
                function = {"name": required_string(block, "name", at),
                            "arguments": json.dumps(block["input"])}
                turn.setdefault("tool_calls", []).append(
                    {"id": required_string(block, "id", at), "type": "function", "function": function})
                called.add(block["id"])
            elif kind == "thinking" and role == "assistant":
                only_keys(block, ("type", "thinking", "signature"), at)
                thinking = required_string(block, "thinking", at)
                turn["reasoning_content"] = turn.get("reasoning_content", "") + thinking
            elif kind in ("tool_result", "tool_use", "thinking"):
                owner = "user" if kind == "tool_result" else "assistant"
                raise ApiError(f"Invalid '{at}.type': a {kind} block belongs in a message of role "
                               f"{owner}, not {role}.", f"{at}.type", code="invalid_value")
            else:
                raise refuse(f"{at}.type", kind, "text, tool_use, tool_result and thinking blocks only (no "
                             "images, documents or redacted thinking)")
        if texts or len(turn) > 1 or not content:
            out.append({**turn, "content": "\n".join(texts)})
    return out


def _result_text(content, at: str) -> str:
    """A tool_result's content: a text, or text blocks one a line."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(f"Invalid '{at}': expected a string or text blocks.", at, code="invalid_type")
    for k, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise refuse(f"{at}[{k}].type", block.get("type") if isinstance(block, dict) else block,
                         "a tool result of text only")
    return "\n".join(required_string(block, "text", f"{at}[{k}]") for k, block in enumerate(content))


def _system_text(system: str | list | None) -> str:
    """`system` as one text (blocks one a line), Claude Code's telemetry block left out."""
    if system is None or isinstance(system, str):
        return system or ""
    if not isinstance(system, list):
        raise ApiError("Invalid 'system': expected a string or a list of text blocks.", "system",
                       code="invalid_type")
    texts = []
    for k, block in enumerate(system):
        at = f"system[{k}]"
        if not isinstance(block, dict) or block.get("type") != "text":
            raise ApiError(f"Invalid '{at}': expected a text block {{\"type\": \"text\", \"text\"}}.", at,
                           code="invalid_value")
        only_keys(block, ("type", "text", "cache_control", "citations"), at)
        text = required_string(block, "text", at)
        if not (k == 0 and BILLING_BLOCK.fullmatch(text)):
            texts.append(text)
    return "\n".join(texts)


def chat_tools(tools: list | None) -> list | None:
    """Anthropic's client tools as chat's function tools; its server tools (web search, bash, text
    editor, …) refused by name."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ApiError(f"Invalid '{at}': expected a tool {{\"name\", \"input_schema\"}}.", at,
                           code="invalid_type")
        if tool.get("type", "custom") != "custom":
            raise refuse(f"{at}.type", tool["type"], "client tools only ({\"name\", \"input_schema\"}); "
                         "Anthropic's server tools run on Anthropic's servers")
        only_keys(tool, ("type", "name", "description", "input_schema", "cache_control", "strict"), at)
        if not isinstance(tool.get("input_schema"), dict):
            raise ApiError(f"Missing required parameter: '{at}.input_schema' (a JSON schema object).",
                           f"{at}.input_schema", code="missing_required_parameter")
        function = {"name": tool.get("name"), "description": tool.get("description"),
                    "parameters": tool["input_schema"], "strict": tool.get("strict")}
        out.append({"type": "function", "function": {k: v for k, v in function.items() if v is not None}})
    return out


# chat's parameter names as a Messages request names them (protocol.renamed)
RENAMES = ((re.compile(r"\bmax_completion_tokens\b"), "max_tokens"),
           (re.compile(r"\btools\[(\d+)\]\.function\.parameters\b"), r"tools[\1].input_schema"),
           (re.compile(r"\btools\[(\d+)\]\.function\b"), r"tools[\1]"),
           (re.compile(r"\btool_choice\.function\b"), "tool_choice"),
           (re.compile(r"\bresponse_format\.json_schema\b"), "output_config.format"),
           (re.compile(r"\bresponse_format\b"), "output_config.format"),
           (re.compile(r"'stop'"), "'stop_sequences'"),
           (re.compile(r"^stop$"), "stop_sequences"),
           (re.compile(r"\bchat_template_kwargs\.enable_thinking\b"), "thinking"),
           (re.compile(r"\bthinking_token_budget\b"), "thinking.budget_tokens"),
           (re.compile(r"\breasoning_effort\b"), "output_config.effort"),
           # a chat message's index is not its message's (system first, tool results apart)
           (re.compile(r"\bmessages\[\d+\](\.\w+|\[\d+\])*"), "messages"))


def error_body(exc: ApiError) -> dict:
    """An error in Anthropic's shape; the parameter, which it has no field for, in the message."""
    message = exc.message if exc.param is None or exc.param in exc.message else f"{exc.param}: {exc.message}"
    return {"type": "error", "error": {"type": ERROR_TYPES.get(exc.status, "api_error"), "message": message}}


# -- the answer as content blocks and events

class ContentBlocks(Segments):
    """One chat answer's segments as a message's content blocks (`blocks`), and the streaming
    events that build them."""

    def __init__(self):
        super().__init__()
        self.blocks: list[dict] = []  # a segment's block at its index

    def started(self, segment: Segment) -> list[dict]:
        if segment.kind == CALL:
            block = {"type": "tool_use", "id": segment.call_id, "name": segment.name, "input": {}}
        elif segment.kind == TEXT:
            block = {"type": "text", "text": ""}
        else:
            block = {"type": "thinking", "thinking": "", "signature": ""}  # nothing signs it
        self.blocks.append(block)
        return [{"type": "content_block_start", "index": segment.index,
                 "content_block": copy.deepcopy(block)}]

    def extended(self, segment: Segment, text: str) -> list[dict]:
        block = self.blocks[segment.index]
        if segment.kind == CALL:
            delta = {"type": "input_json_delta", "partial_json": text}
        elif segment.kind == TEXT:
            block["text"], delta = segment.text, {"type": "text_delta", "text": text}
        else:
            block["thinking"], delta = segment.text, {"type": "thinking_delta", "thinking": text}
        return [{"type": "content_block_delta", "index": segment.index, "delta": delta}]

    def ended(self, segment: Segment, status: str) -> list[dict]:
        if segment.kind == CALL:  # a call cut by max_tokens has no whole input: {}
            try:
                value = json_text.loads(segment.text or "{}")
            except ValueError:
                value = {}
            self.blocks[segment.index]["input"] = value if isinstance(value, dict) else {}
        return [{"type": "content_block_stop", "index": segment.index}]

    def content(self) -> list[dict]:
        """The message's content: its blocks, or one empty text block (a message has at least one)."""
        return self.blocks or [_empty_text()]

    def at_least_one(self) -> list[dict]:
        """A stream's events of the empty text block `content` gives a message where no block began."""
        if self.blocks:
            return []
        return [{"type": "content_block_start", "index": 0, "content_block": _empty_text()},
                {"type": "content_block_stop", "index": 0}]


def _empty_text() -> dict:
    return {"type": "text", "text": ""}


def stop_reason(finish: str, blocks: list[dict], matched: str | None, stop_sequences: list[str] | None
                ) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for chat's finish_reason: max_tokens where the limit
    ran out, tool_use where the answer called tools, stop_sequence where one of the request's
    ended it (a chat template's end of turn is the end of the turn), else end_turn."""
    if finish == "length":
        return "max_tokens", None
    if any(block["type"] == "tool_use" for block in blocks):
        return "tool_use", None
    if matched is not None and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return "end_turn", None


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def usage(prompt_tokens: int, cached: int, output_tokens: int) -> dict:
    """Anthropic's usage: input_tokens are the prompt's tokens not read from the prefix cache."""
    return {"input_tokens": prompt_tokens - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": output_tokens}
