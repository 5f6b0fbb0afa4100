"""The Responses API's pieces without a server (`trtspec.openai.responses`): input items become the
chat conversation they stand for; a chat answer's deltas, cut anywhere, become output items whose
streaming events, replayed as a client replays them, build the same items; chat's refusals are
named as the Responses request names its parameters. Served responses are in test_openai."""

from __future__ import annotations

import json
import math
import random

import pytest

from trtspec.openai.choice import Choice
from trtspec.openai.protocol import ApiError, renamed
from trtspec.openai.reasoning import OPENS_TAG, REASONING
from trtspec.openai.responses import (
    LOGPROBS,
    RENAMES,
    Background,
    OutputItems,
    ResponsesRequest,
    ResponseStore,
    Stored,
    assistant_messages,
    calls_made,
    chat_body,
    chat_tools,
    check_responses,
    input_items,
    input_messages,
    item_page,
    longest_fitting,
    namespaced,
    page_of,
    response_format,
    response_object,
    truncated,
    truncation_cuts,
)
from trtspec.openai.segments import Segments
from trtspec.openai.streams import segment_events
from trtspec.openai.tools import tool_plan
from trtspec.openai.triton_stream import Generation, Step

from .test_tools import TOOLS, _pieces

CALL = {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 1, "b": 2}'}
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}


@pytest.mark.parametrize(("given", "want"), [
    ("1 + 2", [{"role": "user", "content": "1 + 2"}]),
    ([{"role": "developer", "content": "Be brief."}, {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "1 + 2"}, {"type": "input_text", "text": "3 + 4"}]}],
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 + 2\n3 + 4"}]),
    # an earlier answer as OpenAI's SDK sends it back: reasoning, message, calls: one assistant turn
    ([{"role": "user", "content": "q"},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}],
       "encrypted_content": None, "status": "completed"},
      {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [
          {"type": "output_text", "text": "Sure.", "annotations": [], "logprobs": []}]},
      {**CALL, "id": "fc_1", "status": "completed"},
      {**CALL, "call_id": "call_2"},
      {"type": "function_call_output", "call_id": "call_1", "output": "3"},
      {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "3"}]}],
     [{"role": "user", "content": "q"},
      {"role": "assistant", "content": "Sure.", "reasoning_content": "r",
       "tool_calls": [TOOL_CALL, {**TOOL_CALL, "id": "call_2"}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "3"},
      {"role": "tool", "tool_call_id": "call_2", "content": "3"}]),
    # a call right after a user message, and after a tool's output: a turn of its own each
    ([{"role": "user", "content": "q"}, CALL,
      {"type": "function_call_output", "call_id": "call_1", "output": "3"}, {**CALL, "call_id": "call_2"}],
     [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "3"},
      {"role": "assistant", "content": "", "tool_calls": [{**TOOL_CALL, "id": "call_2"}]}]),
    # reasoning with nothing after it: an assistant turn of reasoning alone
    ([{"role": "user", "content": "q"}, {"type": "reasoning", "summary": [],
                                         "content": [{"type": "reasoning_text", "text": "r"}]}],
     [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "reasoning_content": "r"}]),
])
def test_input_items_are_the_chat_conversation_they_stand_for(given, want):
    assert input_messages(given) == want
    assert input_messages(given, calls=set()) == want  # each output answers a call before it


def test_a_function_call_output_answers_a_call_made_before_it():
    """As OpenAI's: an output whose call_id no function_call before it made (in this input, or in
    the conversation it continues: `calls`) is refused; so is one answering a call cut short (status
    incomplete, never made: left out, as it is from a stored response that continues)."""
    output = {"type": "function_call_output", "call_id": "call_1", "output": "3"}
    with pytest.raises(ApiError) as refused:
        input_messages([{"role": "user", "content": "q"}, output], calls={"call_2"})
    assert refused.value.param == "input"
    says = "No tool call found for function call output with call_id call_1 "
    assert refused.value.message.startswith(says)
    with pytest.raises(ApiError):
        input_messages([output, CALL], calls=set())  # after it is too late
    calls = {"call_1"}
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "3"}
    assert input_messages([output], calls=calls) == [tool]
    made = set()
    cut = [{**CALL, "call_id": "call_3", "status": "incomplete"}, {**output, "call_id": "call_3"}]
    with pytest.raises(ApiError) as refused:
        input_messages(cut, calls=made)
    assert refused.value.param == "input[1]" and "cut short (status incomplete)" in refused.value.message
    assert input_messages(cut[:1] + [CALL], calls=made) == [{"role": "assistant", "content": "",
                                                           "tool_calls": [TOOL_CALL]}]
    assert made == {"call_1"}
    assert input_messages(cut) == [{"role": "tool", "tool_call_id": "call_3", "content": "3"}]  # unchecked
    asked = {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL, {**TOOL_CALL, "id": "c"}]}
    assert calls_made([asked, tool]) == {"call_1", "c"}


@pytest.mark.parametrize(("given", "param", "says"), [
    ([], "input", "at least one item"),
    (["hi"], "input[0]", "an item object"),
    ([{"role": "tool", "content": "3"}], "input[0].role", "expected one of"),
    ([{"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}],
     "input[0].content[0].type", "only text parts"),
    ([{"role": "user", "content": "q", "foo": 1}], "input[0].foo", "Unrecognized"),
    ([{"type": "item_reference", "id": "msg_1"}], "input[0].type", "no item_reference"),
    ([{**CALL, "arguments": "{1"}], "input[0].arguments", "not JSON"),
    ([{**CALL, "arguments": "[1]"}], "input[0].arguments", "JSON object"),
    ([{k: v for k, v in CALL.items() if k != "call_id"}], "input[0].call_id", "Missing required"),
    ([{"type": "function_call_output", "output": "3"}], "input[0].call_id", "Missing required"),
    ([{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}], "input[0].encrypted_content",
     "encrypts no reasoning"),
    ([{"type": "reasoning", "content": [{"type": "reasoning_text", "text": 3}]}], "input[0].content",
     "reasoning_text"),
    ([{"role": "user", "content": "q", "id": 3}], "input[0].id", "expected a string"),
    ([{"role": "user", "content": "q", "status": "done"}], "input[0].status", "expected one of"),
])
def test_a_bad_input_item_is_refused_by_its_place(given, param, says):
    with pytest.raises(ApiError) as refused:
        input_messages(given)
    assert refused.value.param == param and says in refused.value.message


def test_the_request_becomes_chats_with_flat_tools_strict_unless_they_say_otherwise():
    req = ResponsesRequest(model="m", input="q", instructions="Be brief.", max_output_tokens=9,
                           temperature=0.0, top_k=5, seed=3,
                           tools=[{"type": "function", "name": "add", "parameters": {}},
                                  {"type": "function", "name": "f", "strict": False}],
                           tool_choice={"type": "function", "name": "add"}, parallel_tool_calls=False,
                           text={"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"},
                                            "strict": True}}, reasoning={"effort": "low", "summary": "auto"})
    body = chat_body(req, [{"role": "user", "content": "earlier"}])
    assert body == {
        "model": "m", "stream": False, "max_completion_tokens": 9, "temperature": 0.0, "top_k": 5, "seed": 3,
        "reasoning_effort": "low",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "earlier"}],
        "tools": [{"type": "function", "function": {"strict": True, "name": "add", "parameters": {}}},
                  {"type": "function", "function": {"strict": False, "name": "f"}}],
        "tool_choice": {"type": "function", "function": {"name": "add"}}, "parallel_tool_calls": False,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "n", "schema": {"type": "object"}}}}
    assert response_format({"type": "text"}) == {"type": "text"}
    with pytest.raises(ApiError) as refused:
        chat_tools([{"type": "file_search"}])
    assert refused.value.param == "tools[0].type"


def test_namespaced_functions_are_chats_tools_and_their_calls_say_their_namespace():
    """A namespace's functions become chat tools named NAMESPACE.NAME, described under the
    namespace's description (Codex's multi-agent tools); their calls' items carry `namespace` and
    the function's own name, and an input function_call with a namespace is that chat call again.
    Hosted web search (Codex declares it in every request) is left out: nothing runs it here. A
    namespaced function's refusal names its place in the request."""
    spawn = {"type": "function", "name": "spawn", "description": "Start one.", "strict": False,
             "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}}
    tools = [{"type": "function", "name": "shell", "parameters": {"type": "object"}},
             {"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [spawn]},
             {"type": "web_search", "external_web_access": False}]
    assert chat_tools(tools) == [
        {"type": "function", "function": {"strict": True, "name": "shell", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"strict": False, "name": "agents.spawn",
                                          "description": "Sub-agents. Start one.",
                                          "parameters": spawn["parameters"]}}]
    assert chat_tools([{"type": "web_search"}]) is None
    assert "tools" not in chat_body(ResponsesRequest(model="m", input="q", tools=[{"type": "web_search"}],
                                                     tool_choice="auto"), [])
    items = OutputItems(namespaced(tools))
    # only a namespace's functions are namespaced (a hosted tool's fields go unread: OpenAI's to run)
    assert namespaced(tools + [{"type": "web_search", "name": "w", "tools": [spawn]}]) == \
        {"agents.spawn": ("agents", "spawn")}
    items.push([{"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                 "function": {"name": "agents.spawn", "arguments": '{"task": "x"}'}}]}])
    items.close()
    (item,) = items.items
    assert (item["name"], item["namespace"], item["arguments"]) == ("spawn", "agents", '{"task": "x"}')
    assert assistant_messages(items.items)[0]["tool_calls"][0]["function"]["name"] == "agents.spawn"
    bad = {**spawn, "name": "stop", "parameters": []}
    with pytest.raises(ApiError) as refused:
        chat_tools([tools[0], {**tools[1], "tools": [spawn, bad]}])
    assert refused.value.param == "tools[1].tools[1].parameters"
    with pytest.raises(ApiError) as refused:
        chat_tools([{"type": "namespace", "name": "agents", "tools": [{"type": "custom", "name": "x"}]}])
    assert refused.value.param == "tools[0].tools[0].type"
    with pytest.raises(ApiError) as refused:  # was offered as "agents.None", then a 500 (tests/api_fuzz.py)
        chat_tools([{"type": "namespace", "name": "agents",
                     "tools": [{"type": "function", "parameters": {}}]}])
    assert refused.value.param == "tools[0].tools[0].name"
    for space in ({"type": "namespace", "tools": [spawn]},
                  {"type": "namespace", "name": "agents", "tools": []}):
        with pytest.raises(ApiError, match="a namespace has a 'name'") as refused:
            chat_tools([space])
        assert refused.value.param == "tools[0]"


def test_chats_refusals_are_named_as_the_responses_request_names_them():
    """The chat path's parameters in a refusal of the translated request: tools' (flat in Responses),
    response_format (text.format), max_completion_tokens (max_output_tokens), messages (input)."""
    for param, want in (("tools[1].function.parameters", "tools[1].parameters"),
                        ("tool_choice.function.name", "tool_choice.name"),
                        ("response_format.json_schema.schema", "text.format.schema"),
                        ("response_format", "text.format"), ("max_completion_tokens", "max_output_tokens"),
                        ("reasoning_effort", "reasoning.effort"),
                        ("messages", "input"), ("messages[3].content", "input"),
                        ("temperature", "temperature")):
        got = renamed(ApiError(f"Invalid '{param}': no.", param, code="invalid_value"), RENAMES)
        assert (got.param, got.message, got.code) == (want, f"Invalid '{want}': no.", "invalid_value")
    # the tool_plan refusal of a flat tool's schema, as a Responses client reads it
    with pytest.raises(ApiError) as refused:
        tool_plan(chat_tools([{"type": "function", "name": "f", "parameters": []}]), None, None, "hermes")
    assert renamed(refused.value, RENAMES).param == "tools[0].parameters"


def _replay(events: list[dict]) -> list[dict]:
    """The output items a client builds from the events (as OpenAI's SDK accumulates them), each
    checked to be done once, as it was added and then written."""
    items: dict[int, dict] = {}
    done: dict[int, dict] = {}
    for event in events:
        kind, at = event["type"], event.get("output_index")
        if kind == "response.output_item.added":
            assert at == len(items) and at not in items
            items[at] = json.loads(json.dumps(event["item"]))
        elif kind == "response.content_part.added":
            items[at]["content"].append(dict(event["part"]))
        elif kind in ("response.output_text.delta", "response.reasoning_text.delta"):
            assert items[at]["id"] == event["item_id"] and at not in done
            items[at]["content"][event["content_index"]]["text"] += event["delta"]
        elif kind == "response.function_call_arguments.delta":
            items[at]["arguments"] += event["delta"]
        elif kind in ("response.output_text.done", "response.reasoning_text.done"):
            assert items[at]["content"][0]["text"] == event["text"]
        elif kind == "response.function_call_arguments.done":
            assert items[at]["arguments"] == event["arguments"]
        elif kind == "response.output_item.done":
            assert at not in done and event["item"]["id"] == items[at]["id"]
            done[at] = event["item"]
    assert sorted(done) == sorted(items)
    return [done[i] for i in sorted(done)]


ANSWERS = [  # where the answer starts, the tool plan (None: no tools), the text
    (REASONING, None, "2+6=8; 8+5=13</think>\n\n838"),
    (OPENS_TAG, None, "just the answer"),
    (REASONING, "auto", 'think</think>Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}'
                        '\n</tool_call>\n<tool_call>\n{"name": "echo", "arguments": {"text": "x"}}\n'
                        '</tool_call>'),
    (None, "named", '{"a": 482, "b": 356}'),
    (None, "auto", "no call at all"),
]


def segments_of(segments: Segments, start: str | None, mode: str | None, pieces: list[str]) -> list[dict]:
    """`segments` built from a chat answer's deltas, the answer (starting at `start`, with tool
    plan `mode` over test_tools' TOOLS) taken in `pieces`; the events that built them."""
    choice = {"named": {"type": "function", "function": {"name": "add"}}}.get(mode, mode)
    plan = None if mode is None else tool_plan(TOOLS, choice, None, "hermes")
    run = Choice(Generation(prompt="", max_tokens=64), [], tools=plan, start=start)
    events = [e for k, piece in enumerate(pieces)
              for e in segments.push(run.deltas(piece, final=k == len(pieces) - 1))]
    return events + segments.close()


@pytest.mark.parametrize(("start", "mode", "text"), ANSWERS)
def test_a_streams_events_build_the_whole_answers_items(start, mode, text):
    """A chat answer cut at 30 random places: the events number 0, 1, … and replayed build the items
    the whole answer gets; the items hold the chat answer's reasoning, content and calls, in order."""
    whole = OutputItems()
    segments_of(whole, start, mode, [text])
    rng = random.Random(7)
    for _ in range(30):
        items = OutputItems()
        events = segments_of(items, start, mode, _pieces(text, rng))
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert _replay(events) == items.items
        # an item holds one content part (a message's text, a reasoning's): every event names part 0
        assert {e["content_index"] for e in events if "content_index" in e} <= {0}
        assert [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items.items] == \
            [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in whole.items]
    kinds = [item["type"] for item in whole.items]
    if start == REASONING:
        assert kinds[0] == "reasoning" and whole.text_of("reasoning") in text
    if mode == "auto" and start == REASONING:
        assert kinds == ["reasoning", "message", "function_call", "function_call"]
        arguments = [json.loads(item["arguments"]) for item in whole.items[2:]]
        assert arguments == [{"a": 1, "b": 2}, {"text": "x"}]
        # sent back as the next request's input, the items are one assistant turn
        (turn,) = assistant_messages(whole.items)
        assert turn["reasoning_content"] == "think" and turn["content"] == "Sure.\n"
        assert [call["function"]["name"] for call in turn["tool_calls"]] == ["add", "echo"]
    if mode == "named":
        assert kinds == ["function_call"] and json.loads(whole.items[0]["arguments"]) == {"a": 482, "b": 356}
    assert all(item["status"] == "completed" for item in whole.items)


@pytest.mark.parametrize("status", ["incomplete", "completed"])  # cut by max_output_tokens, by a stop
def test_a_call_cut_short_is_incomplete_and_left_out_of_the_conversation_it_continues(status):
    """Found fuzzing the served APIs (2026-12-06): a named call cut by max_output_tokens (or a stop
    sequence) was fed back through the input checks as the conversation's next turn, and its
    unfinished arguments failed them: a 400 for a 200 answer, a stream that ended without its last
    event, a background response queued for good. The cut call is incomplete (also where the answer
    stopped at a stop sequence), and a call of status incomplete is no turn of the conversation,
    from the server's output or a client's input alike."""
    items = OutputItems()
    segments_of(items, None, "named", ['{"a": 482, '])
    items.close(status)
    (call,) = items.items
    assert (call["type"], call["status"], call["arguments"]) == ("function_call", "incomplete", '{"a": 482, ')
    assert assistant_messages(items.items) == []
    given = [{"role": "user", "content": "q"}, call, {"role": "user", "content": "again"}]
    assert input_messages(given) == [{"role": "user", "content": "q"}, {"role": "user", "content": "again"}]
    with pytest.raises(ApiError, match=r"input\[1\].arguments': not JSON"):  # a whole call is checked
        input_messages([given[0], {**call, "status": "completed"}])
    # a call whose arguments are whole when the limit ran out is whole: it stays in the conversation
    items = OutputItems()
    segments_of(items, None, "named", ['{"a": 482, "b": 356}'])
    items.close("incomplete")
    assert items.items[0]["status"] == "completed"
    (turn,) = assistant_messages(items.items)
    assert turn["tool_calls"][0]["function"]["arguments"] == '{"a": 482, "b": 356}'


def test_a_bug_at_a_streams_end_ends_it_with_its_failure_not_a_cut():
    """Found fuzzing the served APIs (2026-12-06): an error raised while the last events were made
    ended the stream without a last event (a foreground client waited on a cut stream), and a
    background response lost its failure event (numbered after events never sent). The events made
    before it are sent, then the failure's, numbered in order."""
    import asyncio

    async def nothing_more():
        return
        yield

    def tail(status: str) -> list[dict]:
        raise RuntimeError("planted")

    items = OutputItems()
    run = Choice(Generation(prompt="", max_tokens=8), [])
    first = Step("1+2=3", [49], finish_reason="length", final=True)

    async def collect() -> list[dict]:
        head = lambda: [items.event("response.in_progress")]  # noqa: E731
        failed = lambda message: [items.event("response.failed", message=message)]  # noqa: E731
        return [e async for e in segment_events([first], [nothing_more()], run, items, head, tail, failed)]

    events = asyncio.run(collect())
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-2]["type"] == "response.output_item.done" and events[-2]["item"]["status"] == "incomplete"
    assert (events[-1]["type"], events[-1]["message"]) == ("response.failed", "RuntimeError: planted")


def test_input_items_are_listed_newest_first_in_pages():
    """A text input lists as one user message; items as given, each with an id (its own kept);
    pages newest first (desc, OpenAI's default) or oldest first, after an item, of at most limit."""
    (item,) = input_items("1 + 2")
    assert item["id"].startswith("msg_") and item["content"] == [{"type": "input_text", "text": "1 + 2"}]
    items = input_items([{"role": "user", "content": "q"}, {**CALL, "id": "fc_given"},
                         {"type": "function_call_output", "call_id": "call_1", "output": "3"}])
    assert [i["type"] for i in items] == ["message", "function_call", "function_call_output"]
    assert items[1]["id"] == "fc_given" and len({i["id"] for i in items}) == 3
    page = item_page(items, "desc", None, 2)
    assert page["data"] == items[::-1][:2] and page["has_more"] and page["last_id"] == items[1]["id"]
    rest = item_page(items, "desc", page["last_id"], 2)
    assert rest["data"] == [items[0]] and not rest["has_more"]
    assert item_page(items, "asc", None, 20)["data"] == items
    for args, param in (((items, "up", None, 2), "order"), ((items, "asc", None, 0), "limit"),
                        ((items, "asc", "nope", 2), "after")):
        with pytest.raises(ApiError) as refused:
            item_page(*args)
        assert refused.value.param == param


def _truncations(messages: list[dict]) -> list[list[dict]]:
    return [truncated(messages, cut) for cut in truncation_cuts(messages)]


def _msg(role: str, text: str, **fields) -> dict:
    return {"role": role, "content": text, **fields}


def test_truncation_drops_whole_turns_from_the_oldest_and_keeps_instructions():
    """truncation auto's candidates: the conversation, then without its oldest turn, … down to its
    last; a turn (a user message and what follows it: answers, tool calls, tool results) goes whole,
    system messages stay; a conversation of one turn has one candidate."""
    messages = [_msg("system", "s"), _msg("user", "u1"), _msg("assistant", "a1"), _msg("tool", "t1"),
                _msg("user", "u2"), _msg("system", "s2"), _msg("assistant", "a2"), _msg("user", "u3")]
    assert [[m["content"] for m in kept] for kept in _truncations(messages)] == [
        ["s", "u1", "a1", "t1", "u2", "s2", "a2", "u3"], ["s", "u2", "s2", "a2", "u3"], ["s", "s2", "u3"]]
    short = [_msg("assistant", "a"), _msg("user", "u")]
    assert [[m["content"] for m in kept] for kept in _truncations(short)] == [["a", "u"], ["u"]]
    assert _truncations([_msg("user", "u")]) == [[_msg("user", "u")]]


def test_truncation_never_parts_a_tool_result_from_its_call():
    """A call's result may come after a user message (the Responses API takes items in any order): no
    candidate begins between the call and its last result. Found fuzzing truncation auto
    (2026-12-06): the candidate from that user message on fitted and was sent, a tool result whose
    call was gone."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [_msg("user", "u1"), _msg("assistant", "", tool_calls=[call]), _msg("user", "u2"),
                _msg("tool", "t1", tool_call_id="c1"), _msg("user", "u3"),
                _msg("tool", "t2", tool_call_id="c1"), _msg("user", "u4"),
                _msg("tool", "t3", tool_call_id="elsewhere"), _msg("user", "u5")]
    assert truncation_cuts(messages) == [0, 6, 8]


def test_a_turn_that_makes_a_call_can_still_be_where_a_candidate_begins():
    """Only the cuts between a call and its result are skipped: the user message that begins the
    turn making the call (the one before the call) is a cut, as is the turn after its result."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [_msg("user", "u1"), _msg("assistant", "a1"), _msg("user", "u2"),
                _msg("assistant", "", tool_calls=[call]), _msg("tool", "t1", tool_call_id="c1"),
                _msg("user", "u3")]
    assert truncation_cuts(messages) == [0, 2, 5]


def test_the_longest_fitting_candidate_is_found_in_a_logarithmic_number_of_attempts():
    """Candidates fit from some k on: bisection finds the first that fits (the whole when it fits,
    the last whatever it is) with about log2(count) attempts; the last's refusal propagates."""
    for count in (1, 2, 3, 7, 3200):
        for first in range(count) if count < 10 else (0, 1, 1599, 3198, 3199):
            tried = []

            def attempt(k: int, first=first, count=count, tried=tried):
                tried.append(k)
                if k < first:
                    if k == count - 1:
                        raise ApiError("too long", "input", code="context_length_exceeded")
                    return None
                return f"candidate {k}"

            assert longest_fitting(count, attempt) == (first, f"candidate {first}")
            assert len(tried) <= math.ceil(math.log2(count)) + 2, (count, first, tried)

    def never(k: int):
        if k == 4:
            raise ApiError("too long", "input", code="context_length_exceeded")

    with pytest.raises(ApiError, match="too long"):
        longest_fitting(5, never)


def test_no_candidate_is_attempted_twice():
    """Each attempt renders and tokenizes a conversation (the longest ones first): bisection tries
    a candidate at most once, the last too when it is the one that fits."""
    for count in (2, 3, 7, 100):
        for first in range(1, count):
            tried = []

            def attempt(k: int, first=first, tried=tried):
                tried.append(k)
                return None if k < first else k

            assert longest_fitting(count, attempt) == (first, first)
            assert len(tried) == len(set(tried)), (count, first, tried)


def test_a_background_runs_events_are_followed_from_any_number_live_to_its_end():
    """Background.follow: the events after sequence number N, those already in and those to come,
    in order, ending when the run ends; a follower from past the end gets nothing more."""
    import asyncio

    async def scenario() -> tuple[list, list, list]:
        job = Background(lambda: {"status": job.status})
        events = [{"type": f"e{k}", "sequence_number": k} for k in range(6)]
        for event in events[:3]:
            job.add(event)

        async def read(after: int | None) -> list[int]:
            events = job.follow() if after is None else job.follow(after)  # None: from the first
            return [json.loads(raw.split(b"data: ")[1])["sequence_number"] async for raw in events]

        everything, tail, beyond = (asyncio.create_task(read(after)) for after in (None, 1, 99))
        for event in events[3:]:
            await asyncio.sleep(0.01)  # the readers wait for it
            job.add(event)
        job.end("completed")
        return await everything, await tail, await beyond

    everything, tail, beyond = asyncio.run(scenario())
    assert everything == list(range(6)) and tail == [2, 3, 4, 5] and beyond == []


def test_a_background_response_dropped_from_the_store_stops_and_stays_dropped():
    """The store keeps its last `capacity` responses: a background one dropped while it runs is
    cancelled (nobody can read it), and one deleted stays deleted when its run ends afterwards."""
    import asyncio

    full, deleting = ResponseStore(capacity=1), ResponseStore()

    async def scenario() -> bool:
        job = Background(lambda: {"id": "resp_a", "status": job.status})
        job.task = asyncio.create_task(asyncio.sleep(60))
        full.put({"id": "resp_a", "status": "queued"}, None, [], job)
        full.put({"id": "resp_b", "status": "completed"}, [], [])  # resp_a is dropped
        await asyncio.sleep(0)
        deleting.put({"id": "resp_c", "status": "queued"}, None, [], Background(lambda: {}))
        deleting.delete("resp_c")
        deleting.ended({"id": "resp_c", "status": "cancelled"}, None)  # its run ending after
        return job.task.cancelled()

    assert asyncio.run(scenario())
    for store, gone in ((full, "resp_a"), (deleting, "resp_c")):
        with pytest.raises(ApiError, match="not found"):
            store.get(gone)
    assert full.get("resp_b").response["status"] == "completed"


def test_a_conversation_takes_up_to_openais_limits_and_refuses_one_past_them():
    """A conversation's metadata holds up to 16 pairs, keys of up to 64 characters and values of up
    to 512; a request adds up to 20 items. At each limit it is taken, one past it refused by name."""
    from trtspec.openai.conversations import MAX_ADDED, MAX_METADATA, checked_metadata, new_items

    rng = random.Random(0)

    def text(n: int) -> str:
        return "".join(rng.choice("abcdefghij") for _ in range(n))

    full = {text(8): text(8) for _ in range(MAX_METADATA)}
    assert checked_metadata(full) == full
    longest = {text(64): text(512)}
    assert checked_metadata(longest) == longest
    long_key = text(65)
    for past, param in (({**full, text(9): "v"}, "metadata"), ({long_key: "v"}, f"metadata.{long_key[:64]}"),
                        ({"k": text(513)}, "metadata.k")):
        with pytest.raises(ApiError) as refused:
            checked_metadata(past)
        assert refused.value.param == param
    items = [{"role": "user", "content": text(5)} for _ in range(MAX_ADDED)]
    assert [item["content"][0]["text"] for item in new_items(items)] == [item["content"] for item in items]
    with pytest.raises(ApiError) as refused:
        new_items(items + [{"role": "user", "content": "one more"}])
    assert refused.value.param == "items"


def test_the_conversation_store_keeps_its_newest_and_drops_the_oldest():
    """The store keeps the last `capacity` conversations: one created past it drops the oldest, and
    the newest are all still there."""
    from trtspec.openai.conversations import ConversationStore

    store = ConversationStore(capacity=3)
    made = [store.create([], {"n": str(n)}) for n in range(5)]
    for gone in made[:2]:
        with pytest.raises(ApiError, match="not found"):
            store.get(gone.id)
    assert [store.get(kept.id) for kept in made[2:]] == made[2:]


def test_a_tool_choice_is_chats_left_out_where_no_function_is_offered_and_refused_by_name():
    """tool_choice auto or none where the request offers no function (no tools, or only hosted web
    search, which is not offered) is left out of chat's request, as its tools are; a choice of a
    hosted tool's type, or of a function without a name, is refused naming what is wrong."""
    for tools in (None, [{"type": "web_search"}]):
        for choice in ("auto", "none"):
            body = chat_body(ResponsesRequest(model="m", input="q", tools=tools, tool_choice=choice), [])
            assert "tools" not in body and "tool_choice" not in body
    offered = [{"type": "function", "name": "add", "parameters": {"type": "object"}}]
    refusals = (({"type": "file_search"}, "tool_choice.type"), ({"type": "function"}, "tool_choice"),
                ({"name": "add"}, "tool_choice"),
                ({"type": "function", "name": 3}, "tool_choice"))
    for choice, param in refusals:
        with pytest.raises(ApiError) as refused:
            chat_body(ResponsesRequest(model="m", input="q", tools=offered, tool_choice=choice), [])
        assert refused.value.param == param


def test_a_response_echoes_its_requests_settings_as_openai_does():
    """The response object echoes the request's settings, OpenAI's defaults where it left them out:
    parallel tool calls, a text format, truncation disabled, stored, in the foreground."""
    fmt = {"type": "json_schema", "name": "n", "schema": {"type": "object"}, "strict": True}
    keys = ("parallel_tool_calls", "text", "truncation", "store", "background", "tool_choice")

    def echoed(**given) -> list:
        request = ResponsesRequest(model="m", input="q", **given)
        response = response_object(request, "resp_1", 0, "m", [], "queued")
        return [response[key] for key in keys]

    text = {"format": {"type": "text"}}
    assert echoed() == [True, text, "disabled", True, False, "auto"]
    assert echoed(parallel_tool_calls=False, text={"format": fmt}, truncation="auto", store=False) == \
        [False, {"format": fmt}, "auto", False, False, "auto"]
    assert echoed(parallel_tool_calls=True, background=True, text={"verbosity": "medium"}) == \
        [True, text, "disabled", True, True, "auto"]


@pytest.mark.parametrize(("given", "param"), [
    ({}, None), ({"store": False}, None), ({"background": True}, None), ({"conversation": "conv_1"}, None),
    ({"previous_response_id": "resp_1"}, None), ({"include": [LOGPROBS], "top_logprobs": 2}, None),
    ({"stream": True, "stream_options": {"include_obfuscation": False}}, None),
    ({"reasoning": {"effort": "low"}, "text": {"verbosity": "medium"}, "truncation": "auto"}, None),
    ({"background": True, "store": False}, "background"),
    ({"conversation": "conv_1", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"prompt": {"id": "p"}}, "prompt"), ({"max_tool_calls": 1}, "max_tool_calls"),
    ({"truncation": "on"}, "truncation"), ({"include": [LOGPROBS, "file_search_call.results"]}, "include[1]"),
    ({"top_logprobs": 2}, "top_logprobs"), ({"stream_options": {}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": True}}, "stream_options.include_usage"),
    ({"reasoning": {"budget": 1}}, "reasoning.budget"), ({"text": {"style": "x"}}, "text.style"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
])
def test_a_request_is_checked_for_what_trtspec_does_not_serve_naming_the_parameter(given, param):
    """check_responses takes what trtspec serves (None: nothing refused) and refuses the rest by
    name: a background response not stored, a conversation and a previous response together,
    OpenAI's stored prompts, top_logprobs without the logprobs included, unknown keys."""
    request = ResponsesRequest(model="m", input="q", **given)
    if param is None:
        check_responses(request)
        return
    with pytest.raises(ApiError) as refused:
        check_responses(request)
    assert refused.value.param == param


def test_a_background_or_logprobs_request_is_a_streamed_chat_with_logprobs_and_its_tool_choice():
    """A background response is generated as a stream (its events kept for GET); the message's
    logprobs `include`d are chat's logprobs with its top_logprobs; a tool choice where functions
    are offered is chat's as given."""
    offered = [{"type": "function", "name": "add", "parameters": {"type": "object"}}]
    body = chat_body(ResponsesRequest(model="m", input="q", background=True, include=[LOGPROBS],
                                      top_logprobs=2, tools=offered, tool_choice="auto"), [])
    assert (body["stream"], body["logprobs"], body["top_logprobs"], body["tool_choice"]) == \
        (True, True, 2, "auto")
    body = chat_body(ResponsesRequest(model="m", input="q", stream=True, tools=offered, tool_choice="none"),
                     [])
    assert (body["stream"], body["tool_choice"]) == (True, "none") and "logprobs" not in body


def test_a_page_of_input_items_takes_a_limit_of_1_to_100_and_says_whether_more_follow():
    """`limit` (a query's text) is digits, 1 to 100 (both taken); a page names its first and last
    items, and more follow only where the list goes on past it."""
    items = input_items([{"role": "user", "content": str(k)} for k in range(3)])
    page = page_of(items, {"order": "asc", "limit": "3"})
    assert (page["data"], page["first_id"], page["last_id"], page["has_more"]) == \
        (items, items[0]["id"], items[2]["id"], False)
    assert page_of(items, {})["data"] == items[::-1]
    assert item_page(items, "asc", None, 1)["data"] == items[:1]
    assert item_page(items, "asc", None, 100)["data"] == items
    for limit in ("x", "\u0663", "101", "0"):  # "\u0663" is an Arabic-Indic 3: digits, not ASCII ones
        with pytest.raises(ApiError) as refused:
            page_of(items, {"limit": limit})
        assert refused.value.param == "limit"


def test_a_response_says_why_it_is_incomplete_when_it_completed_and_echoes_its_tools_and_metadata():
    """An incomplete response's details name max_output_tokens; a completed one has a completion
    time; function tools echo strict unless they say otherwise, hosted ones as given; metadata,
    reasoning and a conversation echo as OpenAI's do, empty where left out."""
    tools = [{"type": "function", "name": "add"}, {"type": "function", "name": "f", "strict": False},
             {"type": "web_search"}]
    request = ResponsesRequest(model="m", input="q", tools=tools, metadata={"k": "v"},
                               reasoning={"effort": "low"})
    incomplete = response_object(request, "resp_1", 0, "m", [], "incomplete", conversation="conv_1")
    assert incomplete["incomplete_details"] == {"reason": "max_output_tokens"}
    assert incomplete["completed_at"] is None
    assert incomplete["tools"] == [{"strict": True, **tools[0]}, tools[1], tools[2]]
    assert (incomplete["metadata"], incomplete["reasoning"], incomplete["conversation"]) == \
        ({"k": "v"}, {"effort": "low", "summary": None}, {"id": "conv_1"})
    completed = response_object(ResponsesRequest(model="m", input="q"), "resp_2", 0, "m", [], "completed")
    assert completed["incomplete_details"] is None and isinstance(completed["completed_at"], int)
    assert (completed["metadata"], completed["tools"], completed["conversation"]) == ({}, [], None)


def test_the_store_drops_its_oldest_responses_and_continues_only_finished_ones():
    """Past its capacity the store drops its oldest responses (no run to stop for a foreground
    one); a response continues (previous_response_id) only where it finished, and one not kept is
    named a previous response not found; a stored response stands as it was answered, a
    background one as its run has it until the run ends."""
    store = ResponseStore(capacity=2)
    for k in range(3):
        store.put({"id": f"resp_{k}", "status": "completed"}, [_msg("user", str(k))], [])
    with pytest.raises(ApiError, match="^Previous response with id 'resp_0' not found") as refused:
        store.conversation("resp_0")
    assert (refused.value.param, refused.value.status) == ("previous_response_id", 404)
    assert store.conversation("resp_2") == [_msg("user", "2")]
    store.put({"id": "resp_3", "status": "failed"}, None, [])
    with pytest.raises(ApiError, match="is failed") as refused:
        store.conversation("resp_3")
    assert refused.value.param == "previous_response_id"
    store.delete("resp_3")
    with pytest.raises(ApiError, match="^Response with id 'resp_3' not found"):
        store.get("resp_3")
    job = Background(lambda: {"status": job.status})
    stored = Stored({"status": "queued"}, None, [], job)
    assert Stored({"status": "completed"}, [], []).now() == {"status": "completed"}
    assert stored.now() == {"status": "queued"}
    job.status = "in_progress"
    assert stored.now() == {"status": "in_progress"}
    job.end("completed")
    assert stored.now() == {"status": "queued"}  # as stored: the store's `ended` replaces it
