"""Tool calling's pieces without a server (`trtspec.openai.tools`): the parser's deltas, streamed in
random pieces, merge to the whole answer's message; a required array's objects and hermes blocks
become calls; the guides are compact JSON of the tools' schemas; refusals name their parameter;
conversations with tool calls reach a chat template as vLLM gives them. Served tool calls are in
test_openai (the guided target's own text)."""

from __future__ import annotations

import json
import random

import pytest
import xgrammar as xgr
from transformers.utils.chat_template_utils import render_jinja_template

from trtspec.openai.protocol import ApiError, ChatRequest, check_messages, parse
from trtspec.openai.tools import (
    BLOCK_PARSERS,
    TOOL_CALL_PARSERS,
    ToolParser,
    check_tools,
    merge_deltas,
    tool_plan,
)

ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"]}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "array", "items":
           {"type": "integer"}}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": ADD}},
         {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


def _pieces(text: str, rng: random.Random) -> list[str]:
    """`text` cut at random places (a decode step's text each)."""
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1))) if len(text) > 1 else []
    return [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def _message(plan, pieces: list[str]) -> tuple[dict, list[dict], ToolParser]:
    parser = ToolParser(plan)
    deltas = [d for piece in pieces for d in parser.push(piece)] + parser.finish()
    return merge_deltas(deltas), deltas, parser


def _calls(message: dict) -> list[tuple[str, dict]]:
    calls = message.get("tool_calls", ())
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


HERMES = [  # text, content, calls
    ('Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n<tool_call>\n'
     '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n', "Sure.\n",
     [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo"})]),
    ("no call here  \n", "no call here  \n", []),
    ("  \n", "  \n", []),  # whitespace alone is a text without calls
    ("a < b and <tool_c", "a < b and <tool_c", []),  # a tail that began a tag, at the end
    ('<tool_call>{"name": "add"', '<tool_call>{"name": "add"', []),  # unclosed, not JSON
    ('<tool_call>{"name": "add", "arguments": {"a": 1}}', None, [("add", {"a": 1})]),  # cut after JSON
    ("<tool_call>not json</tool_call> then", "<tool_call>not json</tool_call> then", []),
    ('<tool_call>{"name": 5}</tool_call>', '<tool_call>{"name": 5}</tool_call>', []),  # not a call's shape
    ('x\n<tool_call>{"name": "add", "arguments": {}}</tool_call>\n  y \n', "x\n\n  y \n", [("add", {})]),
    # a call begun ({"name": ..., "arguments": {) is read as JSON: a </tool_call> in a string is text
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "</tool_call>"}}</tool_call>', None,
     [("get_weather", {"city": "</tool_call>"})]),
    ('<tool_call>\n{ "name" : "add" ,\n "arguments": {"a": 1}} \n</tool_call>', None, [("add", {"a": 1})]),
    ('<tool_call>{"name": "add", "arguments": "{}"}</tool_call>',  # arguments no object: as written
     '<tool_call>{"name": "add", "arguments": "{}"}</tool_call>', []),
    ('<tool_call>{"name": "add"}</tool_call>', None, [("add", {})]),  # no arguments: a call without any
    ('\n\n<tool_call>{"name": "add", "arguments": {}}</tool_call>', None, [("add", {})]),  # a blank start
    ("<tool_call>[1, 2]</tool_call>", "<tool_call>[1, 2]</tool_call>", []),  # JSON, but no object
    ("<tool_call></tool_call>", "<tool_call></tool_call>", []),  # an empty block is text, both tags
]


LLAMA = [  # text, content, calls: Llama 3.1's JSON calls (vLLM's llama3_json)
    ('{"name": "add", "parameters": {"a": 1, "b": 2}}', None, [("add", {"a": 1, "b": 2})]),
    ('<|python_tag|>{"name": "add", "parameters": {"a": 1}}; {"name": "get_weather", "parameters": '
     '{"city": "{;}"}}', None, [("add", {"a": 1}), ("get_weather", {"city": "{;}"})]),
    (' \n{"name": "add", "arguments": {"a": 1}}', None, [("add", {"a": 1})]),  # "arguments" too
    ('So {"name": "add", "parameters": {}}', 'So {"name": "add", "parameters": {}}', []),  # text first
    ('{"name": "add", "parameters": {"a": 1}} and then text', "and then text", [("add", {"a": 1})]),
    ('{"name": "add", "param', '{"name": "add", "param', []),  # max_tokens ran out
    ('{"a": 1}', '{"a": 1}', []),  # no call's shape
    ('{"name": "add"}', '{"name": "add"}', []),  # no parameters: no call (vLLM's needs them too)
    ('{"name": "add", "parameters": {}}]', "]", [("add", {})]),  # a stray bracket after a call is text
    ("<|python", "<|python", []),
    ("  ", "  ", []),
]


def _xml(name: str, *parameters: tuple[str, str]) -> str:
    """A qwen3_coder call as Qwen3-Coder's chat template writes one."""
    body = "".join(f"<parameter={arg}>\n{value}\n</parameter>\n" for arg, value in parameters)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


QWEN3_CODER = [  # text, content, calls: Qwen3-Coder's XML calls (vLLM's and TensorRT-LLM's qwen3_coder)
    ("Sure.\n" + _xml("add", ("a", "1"), ("b", "2")) + "\n" + _xml("get_weather", ("city", "New York"),
                                                                     ("days", "[1, 2]")),
     "Sure.\n", [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "New York", "days": [1, 2]})]),
    # a string parameter's value is its text, JSON-like or not; an undeclared one's too
    (_xml("get_weather", ("city", '"3"'), ("hours", "12")), None,
     [("get_weather", {"city": '"3"', "hours": "12"})]),
    (_xml("get_weather", ("city", "a\n</b>\nc")), None, [("get_weather", {"city": "a\n</b>\nc"})]),
    ("<tool_call>\n<function=add>\n<parameter=a>7</parameter></function></tool_call>", None,
     [("add", {"a": 7})]),
    (_xml("add", ("a", "one")), None, [("add", {"a": "one"})]),  # not JSON: the text, as vLLM keeps it
    (_xml("add"), None, [("add", {})]),
    # a block whose function is named is that call, streamed (a slip's text skipped; what its
    # </tool_call> cut short closed)
    ("<tool_call>\n<function=add>\nstray text</function></tool_call>", None, [("add", {})]),
    ("<tool_call>\n<function=add>\n<parameter=a>\n1\n</tool_call>", None, [("add", {"a": 1})]),
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo</tool_call>", None,
     [("get_weather", {"city": "Oslo"})]),
    ("<tool_call>\n<function=add>\n<parameter=b>\n2\n</parameter>\n</function>\n</tool_call>x", "x",
     [("add", {"b": 2})]),
    ("<tool_call>\n<function", "<tool_call>\n<function", []),  # cut before the function is named
    ('<tool_call>{"name": "add", "arguments": {}}</tool_call>',
     '<tool_call>{"name": "add", "arguments": {}}</tool_call>', []),  # hermes' JSON is not this format
    ("<tool_call><function=add>\n<parameter=a>\n1\n</parameter>\n</function></tool_call>", None,
     [("add", {"a": 1})]),  # no newline after <tool_call> (vLLM's parser needs none)
    ("<tool_call>\n<function=add></tool_call>", None, [("add", {})]),  # named just before the block ends
]


AUTO = [("hermes", *case) for case in HERMES] + [("llama3_json", *case) for case in LLAMA] + \
    [("qwen3_coder", *case) for case in QWEN3_CODER]


@pytest.mark.parametrize("parser, text, content, calls", AUTO,
                         ids=[f"{case[0]}-{i}" for i, case in enumerate(AUTO)])
def test_auto_text_becomes_content_and_calls_however_it_is_cut(parser, text, content, calls):
    plan = tool_plan(TOOLS, "auto", None, parser)
    whole, _, parser = _message(plan, [text])
    assert (whole["content"], _calls(whole)) == (content, calls)
    assert parser.finish_reason("stop") == ("tool_calls" if calls else "stop")
    assert parser.finish_reason("length") == "length"
    rng = random.Random(len(text))
    for _ in range(40):
        streamed, deltas, _ = _message(plan, _pieces(text, rng))
        assert (streamed["content"], _calls(streamed)) == (content, calls)
        first = [d["tool_calls"][0] for d in deltas if "id" in d.get("tool_calls", [{}])[0]]
        assert [d["index"] for d in first] == list(range(len(calls)))  # each call begun once, in order
        assert all(d["id"].startswith("call_") and d["type"] == "function" for d in first)


@pytest.mark.parametrize("parser, text", [(case[0], case[1]) for case in AUTO],
                         ids=[f"{case[0]}-{i}" for i, case in enumerate(AUTO)])
def test_every_delta_a_character_at_a_time_carries_text(parser, text):
    """A push that settles nothing gives no delta: each content delta and each call's delta after
    its first (id, name) holds text."""
    deltas = _message(tool_plan(TOOLS, "auto", None, parser), list(text))[1]
    assert all(d["content"] for d in deltas if "content" in d)
    assert all(c["function"]["arguments"] for d in deltas for c in d.get("tool_calls", ()) if "id" not in c)


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = HERMES[0][0]
    message, _, _ = _message(tool_plan(TOOLS, "auto", False, "hermes"), [text])
    assert _calls(message) == [("add", {"a": 1, "b": 2})] and message["content"] == "Sure.\n"


NON_ASCII = [  # parser, text, the call's arguments as vLLM's parser of that name writes them
    ("hermes", '<tool_call>{"arguments": {"city": "Zürich"}, "name": "get_weather"}</tool_call>',
     '{"city": "Zürich"}'),  # read whole (its name not first), written again by json.dumps
    ("llama3_json", '{"parameters": {"city": "Zürich"}, "name": "get_weather"}', '{"city": "Zürich"}'),
    ("qwen3_coder", _xml("get_weather", ("city", "Zürich"), ("days", '["é"]')),
     '{"city": "Zürich", "days": ["é"]}'),
    ("qwen3_coder", _xml("add", ("a", "é")), '{"a": "é"}'),  # not JSON: its text, a string
    ("qwen3_coder", _xml("add", ("é", "1")), '{"é": "1"}'),  # a parameter's name too
]


@pytest.mark.parametrize("parser, text, arguments", NON_ASCII)
def test_arguments_keep_non_ascii_text_as_it_is(parser, text, arguments):
    """A call's arguments that the parser writes itself (a block read whole, Qwen3-Coder's XML read
    into JSON) keep non-ASCII text as it is, not \\u-escaped: json.dumps' ensure_ascii off, as vLLM's
    parsers write them; whole or streamed alike."""
    plan = tool_plan(TOOLS, "auto", None, parser)
    rng = random.Random(0)
    for pieces in ([text], *(_pieces(text, rng) for _ in range(10))):
        message, _, _ = _message(plan, pieces)
        assert [c["function"]["arguments"] for c in message["tool_calls"]] == [arguments]


@pytest.mark.parametrize("parser", BLOCK_PARSERS)
@pytest.mark.parametrize("strict", [False, True])
def test_a_push_gives_out_the_text_after_a_closed_block_at_once(parser, strict):
    """A push gives out all that it settles: a block closed within it is its call, and the text after
    the block that can begin no tag is content in the same push, not held for the next one."""
    tools = [{"type": "function", "function": {**t["function"], "strict": strict}} for t in TOOLS]
    block = _xml("add", ("a", "1")) if parser == "qwen3_coder" else \
        '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    deltas = ToolParser(tool_plan(tools, "auto", None, parser)).push(block + " so")
    message = merge_deltas(deltas)
    assert (message["content"], _calls(message)) == (" so", [("add", {"a": 1})])


@pytest.mark.parametrize("parser", BLOCK_PARSERS)
def test_a_push_gives_out_an_empty_block_and_the_text_after_it_at_once(parser):
    """An empty block is text as soon as its </tool_call> is written, not held to the end."""
    deltas = ToolParser(tool_plan(TOOLS, "auto", None, parser)).push("<tool_call></tool_call> so")
    assert merge_deltas(deltas) == {"role": "assistant", "content": "<tool_call></tool_call> so"}


def test_a_hermes_block_without_newlines_streams_its_call_and_ends_at_once():
    """A call whose object follows <tool_call> at once is streamed once begun, and its </tool_call>
    right after the object ends the block in that push."""
    parser = ToolParser(tool_plan(TOOLS, "auto", None, "hermes"))
    begun = parser.push('<tool_call>{"name": "add", "arguments": {"a": ')
    assert merge_deltas(begun)["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": '}
    message = merge_deltas(begun + parser.push('1}}</tool_call> so'))
    assert (message["content"], _calls(message)) == (" so", [("add", {"a": 1})])


def test_a_strict_qwen3_coder_value_holds_a_whole_tool_call_close_as_its_text():
    """In a strict call (the block ends after its </function>), a string value's `\\n</tool_call>`
    is its text, given out as it comes: the guide allows it there, and it can begin no value's end.
    A max_tokens cut just after it leaves it in the unfinished arguments."""
    strict = [{"type": "function", "function": {**t["function"], "strict": True}} for t in TOOLS]
    plan = tool_plan(strict, "auto", None, "qwen3_coder")
    cut = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</tool_call>"
    message, _, _ = _message(plan, [cut])
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo\\n</tool_call>'


def test_a_strict_qwen3_coder_value_may_end_as_a_function_does():
    """A strict call's string value is its text up to its </parameter>, a `</function>` at its end
    too (XML a coder writes): the parameters after it are read."""
    strict = [{"type": "function", "function": {**t["function"], "strict": True}} for t in TOOLS]
    plan = tool_plan(strict, "auto", None, "qwen3_coder")
    text = _xml("get_weather", ("city", "<function=f>\n</function>"), ("days", "[1]"))
    for pieces in ([text], _pieces(text, random.Random(0))):
        message, _, _ = _message(plan, pieces)
        assert _calls(message) == [("get_weather", {"city": "<function=f>\n</function>", "days": [1]})]


def test_a_streamed_calls_arguments_end_at_their_objects_close_whatever_their_keys():
    """A JSON call streamed as written gives out its arguments' text up to their object's close, not
    the whitespace after it, a first key that is empty or begins with an escape too."""
    plan = tool_plan(TOOLS, "auto", None, "llama3_json")
    for arguments in ('{"": 1}', '{"\\\\": "}"}', '{"a": 1}'):
        message, _, _ = _message(plan, ['{"name": "add", "parameters": ' + arguments + " ", "}"])
        assert message["tool_calls"][0]["function"]["arguments"] == arguments


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(["int", "str", "list", "dict"] if depth < 3 else ["int", "str"])
    if kind == "int":
        return rng.randint(-999, 999)
    if kind == "str":  # brackets, quotes and escapes inside strings must not end an object
        return "".join(rng.choice('ab{}[]",\\:\n é') for _ in range(rng.randint(0, 8)))
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randint(0, 3))}


def test_a_required_array_becomes_its_calls_however_it_is_cut():
    plan = tool_plan(TOOLS, "required", None, None)
    rng = random.Random(7)
    for _ in range(60):
        calls = [(rng.choice(["add", "get_weather"]), {f"k{i}": _random_value(rng, 1) for i in range(3)})
                 for _ in range(rng.randint(1, 4))]
        compact = rng.random() < 0.5  # as the guide writes it; else padded, as no guide does
        text = json.dumps([{"name": n, "parameters": p} for n, p in calls], indent=None if compact else 1)
        message, deltas, parser = _message(plan, _pieces(text, rng))
        assert _calls(message) == calls and message["content"] is None
        # streamed as written: the first delta names the call, the arguments' text follows as it
        # comes (the guide's compact JSON, or the padding as written), nothing after their object
        arguments = [c["function"]["arguments"] for c in message["tool_calls"]]
        assert arguments == [json.dumps(p) for _, p in calls] if compact else \
            all(a.endswith("}") for a in arguments)
        first = [d["tool_calls"][0] for d in deltas if "id" in d["tool_calls"][0]]
        assert [c["function"]["arguments"] for c in first] == [""] * len(calls)
        assert parser.finish_reason("stop") == "tool_calls"
    cut = '[{"name": "add", "parameters": {"a": 1, "b": 2}}, {"name": "add", "param'  # max_tokens ran out
    message, _, _ = _message(plan, _pieces(cut, rng))
    assert _calls(message) == [("add", {"a": 1, "b": 2})] and message["content"] == '{"name": "add", "param'
    # cut inside a call's arguments: the call as far as it was written, as OpenAI's stream leaves it
    message, _, _ = _message(plan, _pieces(cut + 'eters": {"a": 3, "b"', rng))
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == ['{"a": 1, "b": 2}', '{"a": 3, "b"']
    assert message["content"] is None


def test_a_named_call_streams_its_arguments_as_they_come():
    plan = tool_plan(TOOLS, {"type": "function", "function": {"name": "get_weather"}}, None, None)
    text = '{"city": "Oslo", "days": [1, 2]}'
    message, deltas, parser = _message(plan, _pieces(text, random.Random(1)))
    assert message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": text}
    assert message["content"] is None and len(deltas) > 1
    assert deltas[0]["tool_calls"][0]["id"] and all("id" not in d["tool_calls"][0] for d in deltas[1:])
    assert parser.finish_reason("stop") == "stop"  # as OpenAI answers a forced function
    assert plan.param == "tools[1].function.parameters"


def _matcher(grammar: str) -> xgr.GrammarMatcher:
    info = xgr.TokenizerInfo([bytes((i,)) for i in range(256)], xgr.VocabType.RAW, vocab_size=256)
    return xgr.GrammarMatcher(xgr.GrammarCompiler(info, max_threads=1).compile_grammar(grammar))


def _accepts(grammar: str, text: str) -> bool:
    matcher = _matcher(grammar)
    return matcher.accept_string(text) and matcher.is_completed()


def test_the_guides_are_the_schemas_json_written_compactly():
    """A named function's guide takes its arguments as json.dumps writes them and nothing padded or
    off the schema; required's takes an array of {name, parameters} of the tools (one without
    parallel calls)."""
    named = tool_plan(TOOLS, {"type": "function", "function": {"name": "add"}}, None, None).guide
    assert named[0] == "ebnf_grammar"
    assert _accepts(named[1], json.dumps({"a": 3, "b": -41}))
    for off in (json.dumps({"a": 3, "b": -41}, indent=1), '{"a": 3,  "b": 1}', '{"a": 3}',
                '{"a": "3", "b": 1}', json.dumps({"a": 3, "b": 1}, separators=(",", ":"))):
        assert not _accepts(named[1], off), off
    required = tool_plan(TOOLS, "required", None, None).guide[1]
    one, two = {"name": "add", "parameters": {"a": 1, "b": 2}}, {"name": "get_weather", "parameters":
                                                                   {"city": "Oslo", "days": [3]}}
    assert _accepts(required, json.dumps([one])) and _accepts(required, json.dumps([one, two]))
    assert not _accepts(required, "[]") and not _accepts(required, json.dumps([{**one, "name": "sub"}]))
    assert not _accepts(required, json.dumps([{"name": "add", "parameters": {"city": "x"}}]))
    single = tool_plan(TOOLS, "required", False, None).guide[1]
    assert _accepts(single, json.dumps([two])) and not _accepts(single, json.dumps([one, two]))


def test_strict_tools_guide_each_block_auto_opens_and_leave_the_text_free():
    """Under auto with a strict tool, the guide takes any text, and in each <tool_call> block one of
    the tools' calls in hermes' format: a strict tool's arguments by its schema, compactly, another
    tool's any JSON object; without parallel calls the text ends after one block. What it takes,
    the hermes parser reads as calls."""
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}, TOOLS[1]]
    guide = tool_plan(strict, "auto", None, "hermes").guide
    assert guide[0] == "ebnf_grammar"

    def block(name: str, arguments: str) -> str:
        return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'

    calls = "Sure.\n" + block("add", '{"a": 1, "b": 2}') + "\n" + block("get_weather", '{"x": [1]}') + " ok"
    for text in ("any text < at all", "Sure.\n" + block("add", '{"a": 1, "b": 2}'), calls):
        assert _accepts(guide[1], text), text
    for text in (block("add", '{"a": 1}'), block("add", '{"a": 1,  "b": 2}'), block("sub", "{}"),
                 block("get_weather", "[1]")):
        assert not _accepts(guide[1], text), text
    message, _, _ = _message(tool_plan(strict, "auto", None, "hermes"), _pieces(calls, random.Random(2)))
    assert _calls(message) == [("add", {"a": 1, "b": 2}), ("get_weather", {"x": [1]})]
    once = tool_plan(strict, "auto", False, "hermes").guide[1]
    assert _accepts(once, block("add", '{"a": 1, "b": 2}')) and not _accepts(once, calls)
    assert tool_plan(TOOLS, "auto", None, "hermes").guide is None  # no strict tool: the text is free
    xml = tool_plan(strict, "auto", None, "qwen3_coder").guide[1]  # Qwen3-Coder's, its parameters as XML
    calls = "Sure.\n" + _xml("add", ("a", "1"), ("b", "2")) + " ok " + _xml("get_weather", ("x", "[1]"))
    for text in ("free text", calls):
        assert _accepts(xml, text), text
    for text in (_xml("add", ("a", "1")), _xml("add", ("a", "x"), ("b", "2")), _xml("sub")):
        assert not _accepts(xml, text), text
    message, _, _ = _message(tool_plan(strict, "auto", None, "qwen3_coder"), _pieces(calls, random.Random(3)))
    assert _calls(message) == [("add", {"a": 1, "b": 2}), ("get_weather", {"x": "[1]"})]
    llama = tool_plan(strict, "auto", None, "llama3_json").guide[1]  # Llama 3's calls, guided alike
    add = '{"name": "add", "parameters": {"a": 1, "b": 2}}'
    for text in ("free text", add, add + '; {"name": "get_weather", "parameters": {}}'):
        assert _accepts(llama, text), text
    for text in ('{"name": "add", "parameters": {"a": 1}}', '{"name": "sub", "parameters": {}}'):
        assert not _accepts(llama, text), text


@pytest.mark.parametrize("parser", ["hermes", "llama3_json"])
def test_strict_calls_stream_their_arguments_as_written(parser):
    """Under auto with a strict tool the guide makes each call's format certain (the JSON formats:
    `{"name": "NAME", "arguments": ` written compactly), so the parser gives a call's first delta
    once its name is written and its arguments as they come, the text as written; the free text
    around the calls stays content. A block's </tool_call> inside an argument's string does not end
    it (the call's object has not closed); a cut inside the arguments leaves the call as written."""
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}, TOOLS[1]]
    plan = tool_plan(strict, "auto", None, parser)
    rng = random.Random(11)
    key = "arguments" if parser == "hermes" else "parameters"

    def call(name: str, arguments: str) -> str:
        text = f'{{"name": "{name}", "{key}": {arguments}}}'
        return f"<tool_call>\n{text}\n</tool_call>" if parser == "hermes" else text

    for _ in range(40):
        calls = [(rng.choice(["add", "get_weather"]), json.dumps({f"k{i}": _random_value(rng, 1) for i in
                                                                   range(rng.randint(0, 3))}))
                 for _ in range(rng.randint(1, 3))]
        if parser == "hermes":
            lead, tail = rng.choice(["", "Sure.\n"]), rng.choice(["", " done </tool_call>"])
            text = lead + "\n".join(call(n, a) for n, a in calls) + tail
        else:
            lead, tail = "", rng.choice(["", " and then text"])
            text = "; ".join(call(n, a) for n, a in calls) + tail
        message, deltas, _ = _message(plan, _pieces(text, rng))
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == calls
        content = lead + (tail.strip() if parser == "llama3_json" else tail)  # Llama's separators dropped
        assert message["content"] == (content or None)
        first = [d["tool_calls"][0] for d in deltas if "id" in d.get("tool_calls", [{}])[0]]
        assert [c["function"]["arguments"] for c in first] == [""] * len(calls)
    inside = call("get_weather", '{"city": "</tool_call>"}')
    message, _, _ = _message(plan, _pieces(inside, rng))
    assert _calls(message) == [("get_weather", {"city": "</tool_call>"})] and message["content"] is None
    whole = call("add", '{"a": 1, "b": 2}')
    message, _, _ = _message(plan, _pieces(whole[: whole.index('"b"') + 2], rng))  # max_tokens ran out
    assert message["tool_calls"][0]["function"]["arguments"] == '{"a": 1, "b'
    message, _, _ = _message(plan, ["Hi.\n" + call("add", "{}")[:14]])  # before the call's name is written
    assert message == {"role": "assistant", "content": "Hi.\n" + call("add", "{}")[:14]}


@pytest.mark.parametrize("strict", [True, False])
def test_qwen3_coder_calls_stream_as_json_arguments(strict):
    """qwen3_coder's XML calls, strict or not, stream as the JSON arguments their whole call gives
    (a string parameter's text escaped as it comes, another's JSON once its value ends), the first
    delta once the function is named; a value's closing newline and </parameter> (or the block's
    </tool_call>) are held back until certain, so a string may hold newlines and '<'. A cut inside
    a value leaves the arguments unfinished; a block cut before its function is named is text."""
    tools = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}, TOOLS[1]]
    plan = tool_plan(tools if strict else TOOLS, "auto", None, "qwen3_coder")
    rng = random.Random(5)

    def text() -> str:
        return "".join(rng.choice('ab<>/"\\\n é') for _ in range(rng.randint(0, 9)))

    for _ in range(60):
        calls = []  # add's integers; get_weather's city a string, days a list, "note" undeclared (a string)
        for _ in range(rng.randint(1, 3)):
            add = ("add", {"a": rng.randint(-9, 9), "b": rng.randint(0, 99)})
            weather = ("get_weather", {"city": text(), "days": [rng.randint(0, 9)], "note": text()})
            calls.append(add if rng.random() < 0.5 else weather)
        blocks = [_xml(name, *[(k, v if isinstance(v, str) else json.dumps(v)) for k, v in args.items()])
                  for name, args in calls]
        lead = rng.choice(["", "Sure.\n"])
        message, deltas, _ = _message(plan, _pieces(lead + "\n".join(blocks), rng))
        assert _calls(message) == calls and message["content"] == (lead or None)
        first = [d["tool_calls"][0] for d in deltas if "id" in d.get("tool_calls", [{}])[0]]
        assert [c["function"]["arguments"] for c in first] == [""] * len(calls)
    whole = _xml("get_weather", ("city", "Oslo\nnorth"), ("days", "[1]"))
    message, _, _ = _message(plan, _pieces(whole[: whole.index("north") + 2], rng))  # max_tokens ran out
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo\\nno'
    message, _, _ = _message(plan, ["Hi." + whole[:18]])  # the function not yet named
    assert message == {"role": "assistant", "content": "Hi." + whole[:18]}


BAD_TOOLS = [  # tools, tool_choice, parser, param
    ([{"type": "retrieval"}], "required", None, "tools[0].type"),
    ([{"type": "function"}], "required", None, "tools[0].function"),
    ([{"type": "function", "function": {"name": "a b"}}], "required", None, "tools[0].function.name"),
    ([TOOLS[0], TOOLS[0]], "required", None, "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "required", None,
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "params": {}}}], "required", None,
     "tools[0].function.params"),
    ([{"type": "function", "function": {"name": "f", "strict": "yes"}}], "none", None,
     "tools[0].function.strict"),
    ([{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "[0-9"}}}}}], "none", None,
     "tools[0].function.parameters"),  # a strict schema is compiled whatever the choice, as OpenAI checks it
    (TOOLS, {"type": "function", "function": {"name": "sub"}}, None, "tool_choice.function.name"),
    (TOOLS, "sometimes", None, "tool_choice"),
    (TOOLS, {"name": "add"}, None, "tool_choice"),
    (TOOLS, {"type": "function", "function": "add"}, None, "tool_choice"),
    (TOOLS, {"type": "function", "function": {"name": 5}}, None, "tool_choice"),
    (TOOLS, {"type": "custom", "function": {"name": "add"}}, None, "tool_choice"),  # a function's only
    (TOOLS, 5, None, "tool_choice"),  # neither a string nor an object
    ([TOOLS[0]] * 129, "none", None, "tools"),  # OpenAI's limit is 128 tools
    (TOOLS, "auto", None, "tool_choice"),  # no --tool-call-parser
    (TOOLS, None, None, "tool_choice"),  # auto is the default with tools
    (None, "required", None, "tool_choice"),  # nothing to choose
    ([TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "[0-9"}}}}}], "required", None,
     "tools[1].function.parameters"),  # a schema XGrammar cannot compile
]


@pytest.mark.parametrize("tools, choice, parser, param", BAD_TOOLS, ids=[b[3] for b in BAD_TOOLS])
def test_a_bad_tool_request_is_refused_naming_its_parameter(tools, choice, parser, param):
    with pytest.raises(ApiError) as refused:
        tool_plan(tools, choice, None, parser)
    assert refused.value.param == param, refused.value.message
    assert param.split(".")[0].split("[")[0] in refused.value.message


def test_as_many_tools_as_openai_allows_are_served():
    tools = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(128)]
    assert tool_plan(tools, "none", None, None).tools == tools
    assert tool_plan(tools, {"type": "function", "function": {"name": "f127"}}, None, None).name == "f127"


def test_a_guided_tool_choice_takes_no_other_format_nor_min_tokens():
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
            "tool_choice": "required"}
    for extra, param in (({"response_format": {"type": "json_object"}}, "response_format"),
                         ({"guided_regex": "a"}, "guided_regex"), ({"min_tokens": 3}, "min_tokens")):
        with pytest.raises(ApiError) as refused:
            check_tools(parse(ChatRequest, base | extra), None)
        assert refused.value.param == param
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]
    with pytest.raises(ApiError) as refused:  # auto guided by a strict tool
        check_tools(parse(ChatRequest, base | {"tools": strict, "tool_choice": "auto", "guided_regex": "a"}),
                    "hermes")
    assert refused.value.param == "guided_regex" and "strict tools" in refused.value.message
    # auto leaves the text free: a format of the request's own still applies
    plan = check_tools(parse(ChatRequest, base | {"tool_choice": "auto", "guided_regex": "a"}), "hermes")
    assert plan.mode == "auto" and plan.guide is None
    assert check_tools(parse(ChatRequest, base | {"tools": None, "tool_choice": "none"}), None) is None


HERMES_TEMPLATE = (
    "{% if tools %}# Tools\n{% for tool in tools %}{{ tool.function | tojson }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for call in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ call.function.name }}\", \"arguments\": "
    "{{ call.function.arguments | tojson }}}</tool_call>{% endfor %}"
    "{% if m.tool_call_id %} ({{ m.tool_call_id }}){% endif %}{{ '\\n' }}{% endfor %}")


def test_a_conversation_with_tool_calls_reaches_the_template_as_vllm_gives_it():
    """An assistant's tool calls (content null, arguments a JSON object's text) and the tool's answer:
    the template gets the arguments as an object (so `tojson` writes JSON, not a quoted string) and
    the tool message's tool_call_id."""
    arguments = json.dumps({"a": 1, "b": 2})
    body = {"model": "m", "messages": [
        {"role": "user", "content": "1 + 2?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"}]}
    messages = check_messages(parse(ChatRequest, body).messages, None)
    assert messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]}
    assert messages[2] == {"role": "tool", "content": "3", "tool_call_id": "call_1"}
    text = render_jinja_template([messages], chat_template=HERMES_TEMPLATE, tools=TOOLS)[0][0]
    assert text.startswith("# Tools\n" + json.dumps(TOOLS[0]["function"]))
    assert '<assistant><tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n' in text
    assert text.endswith("<tool>3 (call_1)\n")
    bad = [({"role": "tool", "content": "3"}, "messages[0].tool_call_id"),
           ({"role": "user", "content": "x", "tool_call_id": "c"}, "messages[0].tool_call_id"),
           ({"role": "user", "content": "x", "tool_calls": body["messages"][1]["tool_calls"]},
            "messages[0].tool_calls"),
           ({"role": "assistant", "tool_calls": [{"function": {"name": "add", "arguments": "{a"}}]},
            "messages[0].tool_calls[0].function.arguments"),
           ({"role": "assistant", "tool_calls": [{"function": {"name": "add", "arguments": "[1]"}}]},
            "messages[0].tool_calls[0].function.arguments"),
           ({"role": "assistant", "tool_calls": [{"id": "c"}]}, "messages[0].tool_calls[0]"),
           ({"role": "assistant", "content": None}, "messages[0].content")]
    for message, param in bad:
        with pytest.raises(ApiError) as refused:
            check_messages(parse(ChatRequest, {"model": "m", "messages": [message]}).messages, None)
        assert refused.value.param == param, (message, refused.value.message)


def test_serve_offers_every_parser():
    """cli.py lists the parsers itself (it imports no heavy module at start-up): the same ones."""
    from trtspec.cli import serve

    option = next(p for p in serve.params if p.name == "tool_call_parser")
    assert tuple(option.type.choices) == TOOL_CALL_PARSERS


FRAGMENTS = ("<tool_call>", "</tool_call>", "<function=add>", "<function=", ">", "<parameter=a>",
             "<parameter=city>", "</parameter>", "</function>", '{"name": "add", "arguments": ',
             '{"name": "get_weather", "parameters": ', "{", "}", "[", "]", '"', "\\", ":", ",", "\n", " ",
             "a", "1", "<|python_tag|>", "é", "<", "/")


@pytest.mark.parametrize("parser, strict", [(p, s) for p in TOOL_CALL_PARSERS for s in (False, True)] +
                         [("required", True)])
def test_no_model_text_breaks_a_parser(parser, strict):
    """Whatever a model writes (fragments of every format, in random order, cut at random places),
    each parser gives deltas without raising, each call begun once with its id and name, its
    arguments text, and the streamed answer equal to the whole one's content and calls."""
    tools = [{"type": "function", "function": {**t["function"], "strict": strict}} for t in TOOLS]
    plan = tool_plan(tools, "required", None, None) if parser == "required" else \
        tool_plan(tools, "auto", None, parser)
    rng = random.Random(f"{parser}-{strict}")
    for _ in range(500):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 30)))
        whole, deltas, _ = _message(plan, [text])
        streamed, _, _ = _message(plan, _pieces(text, rng))
        for message in (whole, streamed):
            assert message["content"] is None or isinstance(message["content"], str)
            for call in message.get("tool_calls", ()):
                assert call["id"].startswith("call_") and call["function"]["name"]
                assert isinstance(call["function"]["arguments"], str)
        assert (streamed["content"], [c["function"] for c in streamed.get("tool_calls", ())]) == \
            (whole["content"], [c["function"] for c in whole.get("tool_calls", ())]), text


def test_a_compact_guide_is_the_same_json_without_the_whitespace():
    """--compact-json's guides: a json_schema guide and json_object's (XGrammar's builtin JSON: an
    object or an array) take the texts they took, written as json.dumps writes them, and no other
    whitespace between tokens; a guide of another kind is left as it is."""
    import xgrammar as xgr

    from trtspec.spec.grammar import GuideError, compact_guide

    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array"}},
              "required": ["a"]}
    compact = compact_guide("json_schema", json.dumps(schema))
    assert compact[0] == "ebnf_grammar"
    assert _accepts(compact[1], '{"a": "x  y", "b": [1, {"c": null}]}')
    assert not _accepts(compact[1], '{ "a": "x"}') and not _accepts(compact[1], '{"a":"x"}')
    anything = compact_guide("json", "")[1]
    builtin = str(xgr.Grammar.builtin_json_grammar())
    for text in ('{"a": [1, 2]}', "[]", '[{"b": true}, "c"]', "1", '"x"', "null"):
        assert _accepts(anything, text) == _accepts(builtin, text), text
    assert not _accepts(anything, '{"a":  1}') and _accepts(builtin, '{"a":  1}')
    assert compact_guide("regex", "[0-9]+") == ("regex", "[0-9]+")
    with pytest.raises(GuideError, match="not JSON"):
        compact_guide("json_schema", "{")
