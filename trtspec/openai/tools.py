"""Tool calling on /v1/chat/completions: OpenAI's `tools` and `tool_choice`, as vLLM serves them.

- `tool_choice` names a function: the answer is that function's arguments, guided by its
  `parameters` schema. The text becomes one tool call.
- `"required"`: the answer is a JSON array of one or more `{"name", "parameters"}` objects, guided by
  a schema whose items are any of the tools (vLLM's format; `parallel_tool_calls: false` allows
  one). Each object becomes a tool call.
  Both guides are the schema's JSON written compactly, as `json.dumps` writes it: an ebnf_grammar
  guide XGrammar converts from the schema with any_whitespace off. A json_schema guide allows
  whitespace between any two tokens, which a model may fill without end (the embedded one does).
- `"auto"` (the default with tools): the model writes what it likes; the server's tool-call parser
  (`trtspec serve --tool-call-parser hermes`) finds the calls in its text. Hermes' format,
  Qwen2.5's and Qwen3's: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. With a tool
  `"strict": true` (OpenAI's), each block the model opens is guided: one of the tools' names, a
  strict tool's arguments following its schema (another's any JSON object), compactly; the text
  outside the blocks stays free (XGrammar's structural tag, triggered by `<tool_call>`).
  `--tool-call-parser llama3_json` reads Llama 3.1's JSON calls instead, as vLLM's parser of that
  name does: an answer that begins with `{` (or `<|python_tag|>`) is one or more
  `{"name": ..., "parameters": {...}}` objects (`; ` between them), any other answer is text; a
  strict tool guides each `{"name": "` the model writes to a call.
  `--tool-call-parser qwen3_coder` reads the XML calls of Qwen3-Coder, Qwen3.5 and Qwen3.6:
  `<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n...</function>\n</tool_call>`,
  a value the text of a string parameter, any other's JSON (vLLM's and TensorRT-LLM's parser of that
  name); a strict tool guides each `<tool_call>\n<function=` to a call whose parameters follow its
  schema (XGrammar's qwen_xml style).
- `"none"`: plain text.
Every mode gives the tools to the chat template, which shows them to the model.

Guided modes are decoded as any guided request: speculation stays lossless, and the drafts are
guided too. A call streams as it is written, once begun (its name, then its arguments' text).
Streamed and whole answers are built
from the same deltas (`ToolParser.push`), so they agree: a whole answer is its stream's deltas
merged (`merge_deltas`).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from trtspec import json_text
from trtspec.openai.protocol import ApiError, ChatRequest, guide_field
from trtspec.spec.grammar import GuideError, compact_json_grammar, tagged_json_grammar

TOOL_CALL_PARSERS = ("hermes", "llama3_json", "qwen3_coder")  # trtspec serve --tool-call-parser (and cli.py)
BLOCK_PARSERS = ("hermes", "qwen3_coder")  # those whose calls come in <tool_call> blocks
MAX_TOOLS = 128  # OpenAI's limit
# OpenAI's function names; a Responses namespace's functions as NAMESPACE.NAME (`responses.chat_tools`)
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64})?")
EMPTY_PARAMETERS = {"type": "object", "properties": {}}
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"  # Llama 3.1's, before a tool call (when its tokenizer keeps it in the text)
LLAMA_SEPARATORS = " \t\n;"  # between Llama 3's JSON calls


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a chat request's tools ask of the answer."""

    mode: str  # "none", "auto", "required" or "named"
    tools: list[dict]  # for the chat template: [{"type": "function", "function": {...}}]
    name: str | None = None  # the named function
    guide: tuple[str, str] | None = None  # (guide type, guide) for named and required
    parallel: bool = True  # more than one call allowed
    parser: str | None = None  # auto: the server's tool-call parser
    param: str = "tools"  # where a guided mode's guide comes from, named when the model refuses it


def check_tools(req: ChatRequest, parser: str | None) -> ToolPlan | None:
    """The chat request's tool calling (None: no tools), checked with the rest of the request: a
    guided tool_choice takes no other structured output and no min_tokens."""
    plan = tool_plan(req.tools, req.tool_choice, req.parallel_tool_calls, parser)
    if plan is not None and plan.guide is not None:
        mode = f"tool_choice {plan.mode!r}" + (" with strict tools" if plan.mode == "auto" else "")
        other = guide_field(req)
        if other is not None:
            raise ApiError(f"'{other}' cannot be combined with {mode}: the tool calls' format guides the "
                           "text.", other, code="invalid_value")
        if req.min_tokens:
            raise ApiError(f"'min_tokens' cannot be combined with {mode}: the tool calls' format decides "
                           "where the text may end.", "min_tokens", code="invalid_value")
    return plan


def tool_plan(tools: list | None, tool_choice, parallel_tool_calls: bool | None,
              parser: str | None) -> ToolPlan | None:
    """The request's tool calling, checked (an ApiError names what is wrong); None: no tools asked
    for. `parser`: the server's tool-call parser (None: `auto` is refused)."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise ApiError("'tool_choice' needs 'tools': there is no tool to choose.", "tool_choice",
                           code="invalid_value")
        return None
    functions = _functions(tools)
    parallel = parallel_tool_calls is not False
    if tool_choice is None:
        tool_choice = "auto"  # OpenAI's default with tools, as vLLM
    if tool_choice == "none":
        return ToolPlan("none", tools)
    if tool_choice == "auto":
        if parser is None:
            raise ApiError("'tool_choice'='auto' (the default when 'tools' are sent) needs a server started "
                           f"with --tool-call-parser ({', '.join(TOOL_CALL_PARSERS)}); this one has none. "
                           "Send tool_choice 'required', a named function or 'none'.", "tool_choice",
                           code="unsupported_value")
        strict = [t["function"]["name"] for t in tools if t["function"].get("strict") is True]
        if not strict:
            return ToolPlan("auto", tools, parallel=parallel, parser=parser)
        # OpenAI's strict: a call's arguments follow its schema; the text between calls stays free
        schemas = {name: functions[name] if name in strict else {"type": "object"} for name in functions}
        guide = _strict_guide(parser, schemas, parallel)
        return ToolPlan("auto", tools, guide=("ebnf_grammar", guide), parallel=parallel, parser=parser)
    if tool_choice == "required":
        for i, parameters in enumerate(functions.values()):  # a schema that does not compile, by name
            _grammar(parameters, f"tools[{i}].function.parameters")
        grammar = _grammar(_required_schema(functions, parallel), "tools")
        return ToolPlan("required", tools, guide=("ebnf_grammar", grammar), parallel=parallel)
    name = _named(tool_choice)
    if name not in functions:
        raise ApiError(f"Invalid 'tool_choice': function {name!r} is not among 'tools' "
                       f"({', '.join(functions)}).", "tool_choice.function.name", code="invalid_value")
    where = f"tools[{list(functions).index(name)}].function.parameters"
    guide = ("ebnf_grammar", _grammar(functions[name], where))
    return ToolPlan("named", tools, name=name, guide=guide, param=where)


# each parser's call, as strict tools guide it: the trigger that opens one, the text before its
# arguments (`{name}`: the function's name, as a JSON string in the JSON formats), the text after
# them, and the arguments' style (tagged_json_grammar's)
CALL_FORMATS = {
    "hermes": (HERMES_OPEN, HERMES_OPEN + '\n{{"name": {name}, "arguments": ', "}\n" + HERMES_CLOSE, "json"),
    "llama3_json": ('{"name": "', '{{"name": {name}, "parameters": ', "}", "json"),
    "qwen3_coder": (HERMES_OPEN + "\n<function=", HERMES_OPEN + "\n<function={name}>\n",
                    "\n</function>\n" + HERMES_CLOSE, "qwen_xml"),
}


def _strict_guide(parser: str, functions: dict[str, dict], parallel: bool) -> str:
    """Free text in which each call the model opens is one of `functions` (name -> arguments
    schema) in `parser`'s format, its arguments compact JSON or Qwen's XML parameters (with
    parallel false: one call, which ends the text)."""
    trigger, begin, end, style = CALL_FORMATS[parser]
    tags = [(begin.format(name=json.dumps(name) if style == "json" else name), schema, end)
            for name, schema in functions.items()]
    try:
        return tagged_json_grammar(tags, trigger, once=not parallel, style=style)
    except GuideError as exc:
        raise ApiError(f"Invalid 'tools': {exc}.", "tools", code="invalid_value") from None


def _grammar(schema: dict, param: str) -> str:
    """The guide of JSON following `schema`, written compactly (json.dumps' separators and no other
    whitespace: a model may not pad it without end); an ApiError naming `param` if it does not compile."""
    try:
        return compact_json_grammar(schema)
    except GuideError as exc:
        raise ApiError(f"Invalid '{param}': {exc}.", param, code="invalid_value") from None


def _functions(tools: list) -> dict[str, dict]:
    """The tools' functions, name -> parameters schema; an ApiError names the tool that is wrong."""
    if len(tools) > MAX_TOOLS:
        raise ApiError(f"Invalid 'tools': {len(tools)} tools; at most {MAX_TOOLS}.", "tools",
                       code="invalid_value")
    functions: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ApiError(f"Invalid '{where}': expected an object like "
                           '{"type": "function", "function": {"name": ...}}.', where, code="invalid_type")
        if tool.get("type") != "function":
            raise ApiError(f"Invalid '{where}.type': {tool.get('type')!r}; trtspec serves function tools "
                           "only ('function').", f"{where}.type", code="invalid_value")
        extra = sorted(set(tool) - {"type", "function"})
        if extra:
            raise ApiError(f"Unrecognized field in '{where}': {extra[0]!r}.", f"{where}.{extra[0]}",
                           code="invalid_value")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ApiError(f"Missing required parameter: '{where}.function'.", f"{where}.function",
                           code="missing_required_parameter")
        extra = sorted(set(function) - {"name", "description", "parameters", "strict"})
        if extra:
            raise ApiError(f"Unrecognized field in '{where}.function': {extra[0]!r}.",
                           f"{where}.function.{extra[0]}", code="invalid_value")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ApiError(f"Invalid '{where}.function.name': {name!r}; expected 1 to 64 letters, digits, "
                           "underscores or dashes (a Responses namespace's function: NAMESPACE.NAME).",
                           f"{where}.function.name", code="invalid_value")
        if name in functions:
            raise ApiError(f"Invalid '{where}.function.name': {name!r} names an earlier tool too.",
                           f"{where}.function.name", code="invalid_value")
        parameters = function.get("parameters", EMPTY_PARAMETERS)
        if not isinstance(parameters, dict):
            raise ApiError(f"Invalid '{where}.function.parameters': expected a JSON schema object.",
                           f"{where}.function.parameters", code="invalid_value")
        if not isinstance(function.get("strict", False), bool):
            raise ApiError(f"Invalid '{where}.function.strict': expected a boolean.",
                           f"{where}.function.strict", code="invalid_type")
        if function.get("strict") is True:  # compiled now: a schema that does not, named as the tool
            _grammar(parameters, f"{where}.function.parameters")
        if not isinstance(function.get("description", ""), str):
            raise ApiError(f"Invalid '{where}.function.description': expected a string.",
                           f"{where}.function.description", code="invalid_type")
        functions[name] = parameters
    return functions


def _named(tool_choice) -> str:
    """The function a named tool_choice names ({"type": "function", "function": {"name": ...}})."""
    if isinstance(tool_choice, str):
        raise ApiError(f"Invalid 'tool_choice': {tool_choice!r}; expected none, auto, required or "
                       '{"type": "function", "function": {"name": ...}}.', "tool_choice",
                       code="invalid_value")
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" \
            or not isinstance(tool_choice.get("function"), dict) \
            or not isinstance(tool_choice["function"].get("name"), str):
        raise ApiError("Invalid 'tool_choice': expected none, auto, required or "
                       '{"type": "function", "function": {"name": ...}}.', "tool_choice",
                       code="invalid_value")
    return tool_choice["function"]["name"]


def _required_schema(functions: dict[str, dict], parallel: bool) -> dict:
    """vLLM's format for tool_choice "required": an array of {"name", "parameters"} objects, each any
    of the tools."""
    calls = [{"type": "object", "properties": {"name": {"type": "string", "enum": [name]},
                                               "parameters": parameters},
              "required": ["name", "parameters"]} for name, parameters in functions.items()]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    return schema if parallel else {**schema, "maxItems": 1}


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call(index: int, name: str, arguments: str) -> dict:
    """A whole tool call as a stream delta: id, type and name come with a call's first delta."""
    return {"index": index, "id": call_id(), "type": "function",
            "function": {"name": name, "arguments": arguments}}


@dataclass(slots=True)
class JsonDepth:
    """The nesting depth of JSON text fed a character at a time, brackets inside strings skipped."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False  # the last character was a backslash in a string
    opened: bool = False  # a bracket was opened: at depth 0 again, the value is over

    def feed(self, ch: str) -> str:
        """"open" or "close" where `ch` changes the depth, "string" inside a string (its quotes
        included), else "other"."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
            return "string"
        if ch == '"':
            self.in_string = True
            return "string"
        if ch in "[{":
            self.depth, self.opened = self.depth + 1, True
            return "open"
        if ch in "]}":
            self.depth -= 1
            return "close"
        return "other"


# a JSON call's start, once its arguments' object opens: the name first (as the guides write it,
# json.dumps' separators, and as models trained on hermes' and Llama's formats write it), then the
# arguments' key; a call so begun is streamed from there
CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z0-9_.-]{1,129})"\s*,\s*"(?:parameters|arguments)"\s*:\s*'
                       r"(?=\{)")


# Qwen3-Coder's call inside a <tool_call> block: the function, then each parameter (one newline
# around a value is the format's, as its chat template writes it), read by `XmlCallReader`
XML_HEAD = re.compile(r"\s*<function=([^>\n]+)>")
XML_OPEN = re.compile(r"\s*<parameter=([^>\n]+)>")
XML_VALUE_END, XML_END = "</parameter>", "</function>"
# what may end a value being written: its </parameter>, or the block's end (an unguided call's slip),
# each after the format's newline or without it
VALUE_ENDS = tuple(newline + tag for tag in (XML_VALUE_END, HERMES_CLOSE) for newline in ("\n", ""))


@dataclass(slots=True)
class XmlCallReader:
    """A qwen3_coder call read as it is written, once its `<function=NAME>` is, into the JSON
    arguments vLLM's parser of that name gives it (`_xml_value`): `{"ARG": VALUE,
    …}`, a string parameter's value its text JSON-escaped as it comes, another's the JSON it holds
    (else its text) once its </parameter> is written. `read` takes the block's text so far and
    gives what it adds; a value's end (one newline, then </parameter>, or the block's </tool_call>)
    is held back until certain.
    Text between parameters that is no tag (a model's slip; a strict tool's guide allows none) is
    skipped. `close` ends arguments that the block's end cut short."""

    properties: Callable[[str], dict]  # a function's name -> its parameters' `properties`
    name: str | None = None  # the function, once read
    at: int = 0  # where the text not yet read begins
    fields: int = 0  # parameters begun
    arg: str | None = None  # the parameter whose value is being read
    string: bool = False  # that value is a string's (given out as it comes)
    done: bool = False  # </function> read: the arguments are whole

    def read(self, text: str, ended: bool = False) -> str:
        """The arguments' text that the block's `text` so far adds (the function's name, once read,
        is `name`); `ended`: `text` is the whole block (a tag at its end is settled)."""
        out = ""
        while not self.done:
            if self.name is None:
                head = XML_HEAD.match(text, self.at)
                if head is None or not (ended or head.end() < len(text)):  # the newline after it, or none
                    return out
                self.name, self.at = head.group(1), self._past_newline(text, head.end())
            elif self.arg is None:
                rest = text[self.at:].lstrip()
                if rest.startswith(XML_END):
                    out += "}" if self.fields else "{}"
                    self.done, self.at = True, text.index(XML_END, self.at) + len(XML_END)
                    return out
                param = XML_OPEN.match(text, self.at)
                if param is None:
                    if not rest or any(tag.startswith(rest) or rest.startswith(tag)
                                       for tag in (XML_END, "<parameter=", HERMES_CLOSE)):
                        return out  # what may yet be a tag (the block's end: never read past it)
                    after = len(text) - len(rest) + 1  # a slip's text skipped, up to the next '<'
                    tag = text.find("<", after)
                    self.at = len(text) if tag < 0 else tag
                    continue
                if not (ended or param.end() < len(text)):
                    return out
                self.arg = param.group(1)
                self.string = _xml_string(self.properties(self.name).get(self.arg))
                out += ("{" if not self.fields else ", ") + json.dumps(self.arg, ensure_ascii=False) + ": "
                out += '"' if self.string else ""
                self.fields, self.at = self.fields + 1, self._past_newline(text, param.end())
            else:
                end = text.find(XML_VALUE_END, self.at)
                if end < 0:
                    if self.string:  # what may be the value's end (or the block's) stays back
                        value = text[self.at:]
                        value = value[: len(value) - max(tag_prefix(value, tag) for tag in VALUE_ENDS)]
                        out += json.dumps(value, ensure_ascii=False)[1:-1]
                        self.at += len(value)
                    return out
                out += self._value_end(text[self.at:end].removesuffix("\n"))
                self.at = end + len(XML_VALUE_END)
        return out

    def close(self, text: str) -> str:
        """The arguments' text the whole block `text` (its </tool_call> after it) adds, ended where
        the block ended before they did: the value being read as its text gives it, then the brace."""
        out = self.read(text, ended=True)
        if self.done or self.name is None:
            return out
        if self.arg is not None:
            out += self._value_end(text[self.at:].removesuffix("\n"))
        self.done = True
        return out + ("}" if self.fields else "{}")

    def _value_end(self, rest: str) -> str:
        """The end of the value being read, `rest` its text not yet given out (a string's) or all of
        it (another's)."""
        schema = self.properties(self.name).get(self.arg)
        self.arg = None
        if self.string:
            return json.dumps(rest, ensure_ascii=False)[1:-1] + '"'
        return json.dumps(_xml_value(rest, schema), ensure_ascii=False)

    @staticmethod
    def _past_newline(text: str, end: int) -> int:
        return end + 1 if text.startswith("\n", end) else end


@dataclass(slots=True)
class ToolParser:
    """One choice's text as deltas: `{"content": text}` or `{"tool_calls": [call delta]}`.
    `push` takes the text as it comes; `finish` flushes what is held back.

    Calls are given out as they are written: a JSON call (required's array, hermes' and Llama's
    formats) once it has written `CALL_HEAD` (its first delta: id, name), then its arguments' text
    as it comes, as OpenAI streams them; a qwen3_coder call once its function is named, read into
    JSON (`XmlCallReader`). A max_tokens cut leaves the arguments unfinished.
    A block that has not begun a call (no `CALL_HEAD`, no `<function=NAME>`) is read whole once it
    closes: a hermes call in another order, or text."""

    plan: ToolPlan
    calls: int = 0  # tool calls started so far
    held: str = ""  # text not yet given out
    in_call: bool = False  # hermes: inside <tool_call> ... </tool_call>
    blank: bool = True  # hermes: nothing but whitespace since the text's start or the last block
    json: JsonDepth = field(default_factory=JsonDepth)  # required, llama3_json, hermes blocks read as JSON
    start: int = -1  # where the object being scanned begins in `held`
    # characters of `held` scanned; hermes: 0 until a block is read as JSON, -1 once its object closed
    scanned: int = 0
    streamed: int = -1  # in the object being scanned, the end of the text read for its call; -1: none
    arguments: JsonDepth = field(default_factory=JsonDepth)  # the streamed call's arguments' depth
    xml: XmlCallReader | None = None  # qwen3_coder: the call being read
    lead: str | None = None  # llama3_json: "calls" or "content", once the answer's start tells
    stray: str = ""  # llama3_json: text between calls that is no separator (content at the end)
    deltas: list[dict] = field(default_factory=list)

    def push(self, text: str) -> list[dict]:
        self.deltas = []
        if self.plan.mode == "named":
            if text or not self.calls:
                self._arguments(text)
        elif self.plan.mode == "required":
            self.held += text
            self._scan_objects(2)
        elif self.plan.mode == "auto" and self.plan.parser == "llama3_json":
            self.held += text
            self._scan_llama()
        elif self.plan.mode == "auto":  # hermes and qwen3_coder: <tool_call> blocks
            self.held += text
            self._scan_hermes(final=False)
        elif text:
            self.deltas.append({"content": text})
        return self.deltas

    def finish(self) -> list[dict]:
        """What is still held back, at the end of the text: a required array's unfinished object
        (max_tokens ran out) is content unless its call was being streamed; so is an auto answer's
        held tail, save an unclosed <tool_call> whose body is a call."""
        self.deltas = []
        if self.plan.mode == "named" and not self.calls:
            self._arguments("")
        elif self.plan.mode == "required":  # cut by max_tokens inside an object: content, unless streamed
            self._content(self.held if self.streamed < 0 else "")
        elif self.plan.mode == "auto" and self.plan.parser == "llama3_json":
            self._content(self.stray + (self.held if self.streamed < 0 else ""))  # text, or what no call took
        elif self.plan.mode == "auto":
            self._scan_hermes(final=True)
        self.held = ""
        return self.deltas

    def finish_reason(self, reason: str) -> str:
        """The choice's finish_reason: a model that stopped after tool calls (required, auto) stopped
        for them; a named function's call ends as a stop, as OpenAI's does."""
        if reason == "stop" and self.calls and self.plan.mode in ("required", "auto"):
            return "tool_calls"
        return reason

    # -- the modes

    def _content(self, text: str) -> None:
        if text:
            self.deltas.append({"content": text})

    def _arguments(self, text: str) -> None:
        if not self.calls:
            self._begin(self.plan.name, text)
        else:
            self._more_arguments(text)

    def _begin(self, name: str, arguments: str = "") -> bool:
        """A call's first delta (id, type, name, and its arguments so far), numbered after the calls
        before it. False: with parallel_tool_calls false, a call past the first, dropped."""
        if self.calls and not self.plan.parallel:
            return False
        self.deltas.append({"tool_calls": [_call(self.calls, name, arguments)]})
        self.calls += 1
        return True

    def _more_arguments(self, text: str) -> None:
        self.deltas.append({"tool_calls": [{"index": self.calls - 1, "function": {"arguments": text}}]})

    def _scan_llama(self) -> None:
        """Llama 3's JSON calls: an answer whose first text is `{` or <|python_tag|> is calls, each
        streamed once begun (`_scan_objects`); any other answer is content as it comes."""
        if self.lead is None:
            tagged = leading_tag(self.held, PYTHON_TAG)
            if tagged is None:
                return  # whitespace, or what may be the tag: the answer's start decides
            start = self.held.lstrip()
            if tagged or start.startswith("{"):
                self.lead, self.held = "calls", start.removeprefix(PYTHON_TAG)
            else:
                self.lead = "content"
        if self.lead == "content":
            self._content(self.held)
            self.held = ""
        else:
            self._scan_objects(1)

    def _scan_objects(self, level: int) -> None:
        """Give out each JSON object at nesting depth `level` (required's array items at 2, Llama's
        calls at 1) as a call, streamed where guided (`_stream`), else once it closes; hold only
        the object being written. At depth 0 Llama's separators are dropped and any other text
        kept for the end."""
        text = self.held
        for i in range(self.scanned, len(text)):
            kind = self.json.feed(text[i])
            if kind == "open" and self.json.depth == level:
                self.start = i
            elif kind == "close" and self.json.depth == level - 1:
                self._object_call(text[self.start: i + 1])  # closed by "]" too: a slip, no call's shape
                self.start = -1
            elif kind == "close" and self.json.depth < 0:  # a stray bracket at the top: text
                self.json.depth = 0
                self.stray += text[i]
            elif kind == "other" and self.json.depth == 0 and (self.stray or text[i] not in LLAMA_SEPARATORS):
                self.stray += text[i]
        if self.start < 0:  # between objects: the brackets, commas and whitespace are the format's
            self.held, self.scanned = "", 0
        else:
            self.held, self.scanned, self.start = text[self.start:], len(text) - self.start, 0
            self._stream(self.held)

    def _stream(self, text: str) -> None:
        """A JSON call being written, `text` its object so far (still open): its first delta once
        `CALL_HEAD` is written, then the arguments written since the last delta."""
        if self.plan.mode == "named":
            return
        if self.streamed < 0:
            head = CALL_HEAD.match(text)
            if head is None or not self._begin(head.group(1)):
                return
            self.streamed, self.arguments = head.end(), JsonDepth()
        given = []  # the arguments' characters, up to their object's close (the rest is the format's)
        for ch in text[self.streamed:]:
            if self.arguments.depth == 0 and self.arguments.opened:
                break
            self.arguments.feed(ch)
            given.append(ch)
        self.streamed = len(text)
        if given:
            self._more_arguments("".join(given))

    def _object_call(self, text: str) -> None:
        """A call from {"name": str, "parameters" (or "arguments"): object} (required: the guide made
        it so; llama3_json: the model wrote it); other text as written. A streamed call's arguments
        end before the object's closing brace."""
        self._stream(text[:-1])  # what came since the last piece (or the whole call, in one piece)
        if self.streamed >= 0:  # begun, the call stands (a slip's "]" leaves its arguments unfinished)
            self.streamed = -1
        elif text[-1] != "}" or not self._take_call(text, ("parameters", "arguments"), missing_ok=False):
            self._content(text)

    def _take_call(self, text: str, keys: tuple[str, ...], missing_ok: bool) -> bool:
        """Give out the call `text` holds, {"name": str, <the first of `keys` it has>: object} (with
        none of them an empty object when `missing_ok`). False: `text` holds no call."""
        try:
            one = json_text.loads(text)
        except ValueError:
            return False
        if not isinstance(one, dict):
            return False
        parameters = next((one[key] for key in keys if key in one), {} if missing_ok else None)
        if not (isinstance(one.get("name"), str) and isinstance(parameters, dict)):
            return False
        self._emit(one["name"], parameters)
        return True

    def _properties(self, name: str) -> dict:
        """The `properties` of the tool `name`'s parameters schema ({} for no such tool)."""
        for tool in self.plan.tools:
            if tool["function"]["name"] == name:
                return (tool["function"].get("parameters") or {}).get("properties") or {}
        return {}

    def _emit(self, name: str, parameters: dict) -> None:
        """A whole call's delta (`_begin`)."""
        self._begin(name, json.dumps(parameters, ensure_ascii=False))

    def _scan_hermes(self, final: bool) -> None:
        """Content outside <tool_call> blocks; each block whose body is {"name": str, "arguments":
        object} a call (with parallel_tool_calls false, the first only; streamed once begun:
        `_json_block`), any other block content as written. Text between blocks that is only
        whitespace is dropped, so a blank start of text waits for what follows it; so does a tail
        that may begin a tag."""
        while True:
            if self.in_call and self.plan.parser == "hermes" and \
                    (self.plan.guide is not None or self.scanned != 0 or CALL_HEAD.match(self.held.lstrip())):
                if not self._json_block(final):  # a strict tools' block, or one whose call has begun
                    return
                continue
            if self.in_call and self.plan.parser == "qwen3_coder" and \
                    (self.plan.guide is not None or self.xml is not None or XML_HEAD.match(self.held)):
                if not self._xml_block(final):  # a strict tools' block, or one whose function is named
                    return
                continue
            if self.in_call:
                end = self.held.find(HERMES_CLOSE)
                if end < 0 and not final:
                    return
                body = self.held if end < 0 else self.held[:end]  # final: an unclosed block
                self._end_block(end)
                xml = self.plan.parser == "qwen3_coder"  # its block that names no function is text
                if xml or not self._take_call(body, ("arguments",), missing_ok=True):
                    self._content(HERMES_OPEN + body + ("" if end < 0 else HERMES_CLOSE))
                continue
            begin = self.held.find(HERMES_OPEN)
            if begin >= 0:
                before = self.held[:begin]
                self._content(before if before.strip() or not self.blank else "")
                self.held, self.in_call = self.held[begin + len(HERMES_OPEN):], True
                continue
            keep = 0 if final else tag_prefix(self.held, HERMES_OPEN)
            out = self.held[: len(self.held) - keep]
            if self.blank and not out.strip():  # only whitespace so far: kept for a text without calls
                out = out if final and not self.calls else ""
                if not final:
                    return
            self._content(out)
            self.blank = self.blank and not out.strip()
            self.held = "" if final else self.held[len(out):]
            return

    def _end_block(self, end: int) -> None:
        """Past a <tool_call> block: `held` from after its </tool_call> at `end` (-1: the text ended
        in it), the block's reading state reset."""
        self.held = "" if end < 0 else self.held[end + len(HERMES_CLOSE):]
        self.in_call, self.blank, self.json, self.xml = False, True, JsonDepth(), None
        self.start, self.scanned, self.streamed = -1, 0, -1

    def _json_block(self, final: bool) -> bool:
        """A hermes <tool_call> block read as its JSON call (strict tools', or one whose `CALL_HEAD`
        is written), streamed as written (`_stream`); the text after the call's object up to
        </tool_call> is the format's, and a </tool_call> inside the object's strings does not end
        it. True once the block is over: closed, or at the end of the text (a call cut by
        max_tokens stays as far as written; a block cut before its call's name is content)."""
        text = self.held
        if self.scanned >= 0:  # the call's object is still being written
            for i in range(self.scanned, len(text)):
                kind = self.json.feed(text[i])
                if kind == "open" and self.json.depth == 1:
                    self.start = i
                elif kind == "close" and self.json.depth == 0:
                    self._object_call(text[self.start: i + 1])
                    self.held, self.scanned = text[i + 1:], -1  # -1: the object is over
                    break
            else:
                self.scanned = len(text)
                if self.start >= 0:
                    self._stream(text[self.start:])
                if not final:
                    return False
                if self.streamed < 0:
                    self._content(HERMES_OPEN + text)
                self.held = ""
        end = self.held.find(HERMES_CLOSE)
        if end < 0 and not final:
            return False
        self._end_block(end)
        return True

    def _xml_block(self, final: bool) -> bool:
        """A qwen3_coder <tool_call> block (strict tools', or one whose `<function=NAME>` is
        written), its call streamed as it is read (`XmlCallReader`); True once the block is over,
        as `_json_block`. A strict call's block ends after its </function> (its strings may hold
        any text); another's at its first </tool_call>, which closes what it cut short."""
        if self.xml is None:
            self.xml = XmlCallReader(self._properties)
        end = self.held.find(HERMES_CLOSE, self.xml.at) if self.xml.done or self.plan.guide is None else -1
        body = self.held if end < 0 else self.held[:end]
        arguments = self.xml.read(body) if end < 0 else self.xml.close(body)
        if self.xml.name is not None and self.streamed < 0:
            if self._begin(self.xml.name):
                self.streamed = 0
            else:  # a call past the first, dropped: read no further
                self.xml.done, arguments = True, ""
        if arguments and self.streamed >= 0:
            self._more_arguments(arguments)
        if end < 0 and self.xml.done:  # a strict call's </function> just read: its block may close here
            end = self.held.find(HERMES_CLOSE, self.xml.at)
        if end < 0 and not final:
            return False
        if self.xml.name is None:  # it named no function: the block's text
            self._content(HERMES_OPEN + body + ("" if end < 0 else HERMES_CLOSE))
        self._end_block(end)
        return True


def _xml_string(schema) -> bool:
    """Whether a qwen3_coder parameter's value is its text: a string parameter's (and a parameter
    the tool does not declare: vLLM's rule); any other's is JSON."""
    kinds = schema.get("type") if isinstance(schema, dict) else "string"
    return "string" in (kinds if isinstance(kinds, list) else [kinds])


def _xml_value(text: str, schema) -> object:
    """A qwen3_coder parameter's value: a string parameter's text as it is, any other's JSON value
    when the text is JSON (`_xml_string`)."""
    if _xml_string(schema):
        return text
    try:
        return json_text.loads(text)
    except ValueError:
        return text


def leading_tag(text: str, tag: str) -> bool | None:
    """Whether `text`, leading whitespace skipped, begins with `tag`; None while it cannot tell yet
    (only whitespace, or a start of the tag)."""
    start = text.lstrip()
    if not start or (tag.startswith(start) and start != tag):
        return None
    return start.startswith(tag)


def tag_prefix(text: str, tag: str) -> int:
    """Length of the longest tail of `text` that begins `tag` (held back until the next text)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def merge_deltas(deltas: list[dict]) -> dict:
    """A whole answer's message from its stream's deltas: content joined (null when there is none
    beside tool calls), each call's arguments joined."""
    content, calls = "", []
    for delta in deltas:
        content += delta.get("content", "")
        for part in delta.get("tool_calls", ()):
            if part["index"] == len(calls):
                calls.append({"id": part["id"], "type": "function",
                              "function": {"name": part["function"]["name"], "arguments": ""}})
            calls[part["index"]]["function"]["arguments"] += part["function"]["arguments"]
    if not calls:
        return {"role": "assistant", "content": content}
    return {"role": "assistant", "content": content or None, "tool_calls": calls}
