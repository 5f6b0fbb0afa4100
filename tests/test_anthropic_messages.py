"""Anthropic's Messages API's pieces without a server (`trtspec.openai.anthropic_messages`): a
request is the chat request it stands for (system, blocks, tools, tool_choice, thinking, output
format); a chat answer's deltas, cut anywhere, become content blocks whose events, replayed as a
client replays them, build the same blocks; stop reasons; chat's refusals named as a Messages
request names its parameters, in Anthropic's error shape. Served messages are in test_openai."""

from __future__ import annotations

import json
import random

import pytest

from trtspec.openai.anthropic_messages import (
    RENAMES,
    ContentBlocks,
    CountTokensRequest,
    MessagesRequest,
    chat_body,
    chat_messages,
    check_messages_request,
    error_body,
    stop_reason,
    usage,
)
from trtspec.openai.protocol import ApiError, renamed
from trtspec.openai.reasoning import OPENS_TAG, REASONING
from trtspec.openai.tools import tool_plan

from .test_responses import ANSWERS, segments_of
from .test_tools import _pieces

BILLING = "x-anthropic-billing-header: cc_version=2.1.3.abc; cc_entrypoint=cli; cch=00000;"
USE = {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}}
CALL = {"id": "toolu_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}


@pytest.mark.parametrize(("system", "messages", "want"), [
    ("Be brief.", [{"role": "user", "content": "1 + 2"}],
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 + 2"}]),
    # Claude Code's telemetry block first is left out (it changes every request); text blocks one a line
    ([{"type": "text", "text": BILLING},
      {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
     [{"role": "user", "content": [{"type": "text", "text": "1 + 2"}, {"type": "text", "text": "3 + 4"}]}],
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 + 2\n3 + 4"}]),
    # a tool loop as Anthropic's SDK sends it back: thinking, text and tool_use one assistant turn;
    # tool results tool messages, in their place before the user's text
    (None, [{"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "r", "signature": ""},
                                              {"type": "text", "text": "Sure."}, USE,
                                              {**USE, "id": "toolu_2"}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                 "content": [{"type": "text", "text": "no"}]},
                {"type": "text", "text": "and 4 + 4?"}]}],
     [{"role": "user", "content": "q"},
      {"role": "assistant", "reasoning_content": "r", "content": "Sure.",
       "tool_calls": [CALL, {**CALL, "id": "toolu_2"}]},
      {"role": "tool", "tool_call_id": "toolu_1", "content": "3"},
      {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no"},
      {"role": "user", "content": "and 4 + 4?"}]),
    # the telemetry block is left out only first, and only whole
    ([{"type": "text", "text": "Be brief."}, {"type": "text", "text": BILLING}],
     [{"role": "user", "content": "q"}],
     [{"role": "system", "content": "Be brief.\n" + BILLING}, {"role": "user", "content": "q"}]),
    # a system message in the conversation (Claude Code's environment notes after the first turn) in
    # its place
    ("Be brief.", [{"role": "user", "content": "q"},
                   {"role": "system", "content": [{"type": "text", "text": "# Environment",
                                                   "cache_control": {"type": "ephemeral"}}]}],
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"},
      {"role": "system", "content": "# Environment"}]),
])
def test_a_conversation_is_the_chat_conversation_it_stands_for(system, messages, want):
    assert chat_messages(system, messages) == want


@pytest.mark.parametrize(("messages", "param", "says"), [
    ([], "messages", "at least one"),
    ([{"role": "developer", "content": "x"}], "messages[0].role", "user, assistant or system"),
    ([{"role": "system", "content": [{"type": "tool_result", "tool_use_id": "t"}]}],
     "messages[0].content[0].type", "of role user, not"),
    ([{"role": "user", "content": [{"type": "image", "source": {}}]}], "messages[0].content[0].type",
     "no images"),
    ([{"role": "user", "content": [USE]}], "messages[0].content[0].type", "of role assistant, not user"),
    ([{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}],
     "messages[0].content[0].type", "of role user, not"),
    ([{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}],
     "messages[0].content[0].type", "redacted"),
    ([{"role": "assistant", "content": [{**USE, "input": "{}"}]}], "messages[0].content[0].input",
     "object"),
    ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text", "Missing"),
    ([{"role": "user", "content": "q", "name": "x"}], "messages[0].name", "Unrecognized"),
    # a tool result answers a tool_use of the assistant turn before it, as Anthropic requires
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"}]}],
     "messages[0].content[0].tool_use_id",
     "unexpected `tool_use_id` found in `tool_result` blocks: toolu_1."),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": [USE]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "3"}]}],
     "messages[2].content[0].tool_use_id", "toolu_2"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": [USE]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"}]},
      {"role": "assistant", "content": "ok"},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"}]}],
     "messages[4].content[0].tool_use_id", "in the previous assistant message"),
])
def test_a_bad_message_is_refused_by_its_place(messages, param, says):
    with pytest.raises(ApiError) as refused:
        chat_messages(None, messages)
    assert refused.value.param == param and says in refused.value.message


def test_consecutive_assistant_messages_are_one_turn_whose_calls_the_results_answer():
    """Anthropic combines consecutive messages of a role into one turn: a tool_use in the first of
    two assistant messages is answered by the user message after the second."""
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"}
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": [USE]},
                {"role": "assistant", "content": "and"}, {"role": "user", "content": [result]}]
    assert chat_messages(None, messages)[-1] == {"role": "tool", "tool_call_id": "toolu_1", "content": "3"}


def test_assistant_messages_opening_the_conversation_are_one_turn_too():
    """Consecutive assistant messages at the very start (a conversation that opens with the
    assistant's turn) are one turn as well: the results after them answer the first one's calls."""
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"}
    messages = [{"role": "assistant", "content": [USE]}, {"role": "assistant", "content": "and"},
                {"role": "user", "content": [result]}]
    assert chat_messages(None, messages)[-1] == {"role": "tool", "tool_call_id": "toolu_1", "content": "3"}


def _request(**ask) -> MessagesRequest:
    return MessagesRequest(model="m", max_tokens=2048, messages=[{"role": "user", "content": "q"}], **ask)


def test_the_request_becomes_chats():
    tools = [{"name": "add", "description": "a + b", "input_schema": {"type": "object"}},
             {"type": "custom", "name": "f", "input_schema": {}, "strict": True}]
    body = chat_body(_request(tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True},
                              thinking={"type": "enabled", "budget_tokens": 1024}, stop_sequences=["\n\n"],
                              temperature=0.5, top_k=4, output_config={"format": {
                                  "type": "json_schema", "schema": {"type": "object"}}}))
    assert body == {
        "model": "m", "messages": [{"role": "user", "content": "q"}], "max_completion_tokens": 2048,
        "stop": ["\n\n"], "stream": False, "temperature": 0.5, "top_k": 4,
        "tools": [{"type": "function", "function": {"name": "add", "description": "a + b",
                                                    "parameters": {"type": "object"}}},
                  {"type": "function", "function": {"name": "f", "parameters": {}, "strict": True}}],
        "tool_choice": "required", "parallel_tool_calls": False,
        "chat_template_kwargs": {"enable_thinking": True}, "thinking_token_budget": 1024,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "output", "schema": {"type": "object"}}}}
    named = {"type": "function", "function": {"name": "add"}}
    for choice, want in (({"type": "auto"}, "auto"), ({"type": "none"}, "none"),
                         ({"type": "tool", "name": "add"}, named)):
        assert chat_body(_request(tools=tools, tool_choice=choice))["tool_choice"] == want
    # a seed (trtspec's, as its answers report one): chat's, so an answer's trtspec.seed samples it again
    assert chat_body(_request(temperature=1, seed=2**63))["seed"] == 2**63
    # effort: the chat template's reasoning_effort variable, as chat's reasoning_effort gives it
    assert chat_body(_request(output_config={"effort": "max"}))["reasoning_effort"] == "max"
    off = chat_body(_request(thinking={"type": "disabled"}))
    assert off["chat_template_kwargs"] == {"enable_thinking": False}
    assert "max_completion_tokens" not in chat_body(CountTokensRequest(model="m", messages=[
        {"role": "user", "content": "q"}]))


@pytest.mark.parametrize(("ask", "param"), [
    ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 4096}}, "thinking.budget_tokens"),  # past max_tokens
    ({"thinking": {"type": "disabled", "budget_tokens": 2000}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "on"}}, "thinking.type"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "required"}}, "tool_choice.type"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"output_config": {"effort": "minimal"}}, "output_config.effort"),  # OpenAI's level, not Anthropic's
    ({"output_config": {"format": {"type": "json_object"}}}, "output_config.format.type"),
])
def test_a_bad_request_field_is_refused_by_name(ask, param):
    with pytest.raises(ApiError) as refused:
        chat_body(_request(**ask))
    assert refused.value.param == param


def test_a_temperature_past_anthropics_range_is_refused():
    """Found fuzzing the served APIs (2026-12-06): temperature 1.5 was taken (chat's range is [0, 2],
    Anthropic's [0, 1])."""
    check_messages_request(_request(temperature=1))
    with pytest.raises(ApiError, match=r"Invalid 'temperature': 1.5; expected 0 to 1") as refused:
        check_messages_request(_request(temperature=1.5))
    assert refused.value.param == "temperature"


def test_claude_codes_context_editing_is_accepted_and_what_is_not_served_is_refused_by_name():
    """Claude Code sends `context_management: {"edits": [{"type": "clear_thinking_20251015", "keep":
    "all"}]}` in every request: accepted (the chat template decides which earlier thinking the model
    sees). Clearing tool results, code execution and MCP servers are refused, each by its name."""
    check_messages_request(_request(context_management={"edits": [{"type": "clear_thinking_20251015",
                                                                    "keep": "all"}]}))
    check_messages_request(_request(context_management={"edits": []}, container=None, mcp_servers=[]))
    for ask, param in (({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
                        "context_management.edits[0].type"),
                       ({"context_management": {"edits": [{"type": "clear_thinking_20251015"}, "x"]}},
                        "context_management.edits[1].type"),
                       ({"context_management": {"trigger": {}}}, "context_management.trigger"),
                       ({"container": "cntr_1"}, "container"),
                       ({"mcp_servers": [{"type": "url", "url": "http://x"}]}, "mcp_servers")):
        with pytest.raises(ApiError) as refused:
            check_messages_request(_request(**ask))
        assert refused.value.param == param


def test_chats_refusals_are_named_as_a_messages_request_names_them_in_anthropics_shape():
    for param, want in (("tools[1].function.parameters", "tools[1].input_schema"),
                        ("tools[0].function.name", "tools[0].name"),
                        ("tool_choice.function.name", "tool_choice.name"),
                        ("response_format.json_schema.schema", "output_config.format.schema"),
                        ("max_completion_tokens", "max_tokens"), ("stop", "stop_sequences"),
                        ("messages[3].content", "messages"), ("temperature", "temperature")):
        got = renamed(ApiError(f"Invalid '{param}': no.", param, code="invalid_value"), RENAMES)
        assert (got.param, got.message) == (want, f"Invalid '{want}': no.")
    with pytest.raises(ApiError) as refused:  # a flat tool's schema, as tool_plan refuses it
        tool_plan([{"type": "function", "function": {"name": "f", "parameters": []}}], None, None,
                  "hermes")
    assert renamed(refused.value, RENAMES).param == "tools[0].input_schema"
    assert error_body(ApiError("Invalid 'top_k': -2.", "top_k")) == \
        {"type": "error", "error": {"type": "invalid_request_error", "message": "Invalid 'top_k': -2."}}
    assert error_body(ApiError("It does not exist.", "model", status=404)) == \
        {"type": "error", "error": {"type": "not_found_error", "message": "model: It does not exist."}}


def _replay(events: list[dict]) -> list[dict]:
    """The content blocks a client builds from the events (as Anthropic's SDK accumulates them: a
    tool_use's input parsed from its JSON deltas at its block's stop), each started, written and
    stopped in turn."""
    blocks: list[dict] = []
    partial: dict[int, str] = {}
    stopped: list[int] = []
    for event in events:
        index = event.get("index")
        if event["type"] == "content_block_start":
            assert index == len(blocks) and stopped == list(range(index))
            blocks.append(json.loads(json.dumps(event["content_block"])))
        elif event["type"] == "content_block_delta":
            assert index == len(blocks) - 1 and index not in stopped
            delta = event["delta"]
            if delta["type"] == "text_delta":
                blocks[index]["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                blocks[index]["thinking"] += delta["thinking"]
            else:
                assert delta["type"] == "input_json_delta" and blocks[index]["type"] == "tool_use"
                partial[index] = partial.get(index, "") + delta["partial_json"]
        elif event["type"] == "content_block_stop":
            stopped.append(index)
            if blocks[index]["type"] == "tool_use":
                blocks[index]["input"] = json.loads(partial.get(index) or "{}")
    assert stopped == list(range(len(blocks)))
    return blocks


@pytest.mark.parametrize(("start", "mode", "text"), [a for a in ANSWERS if a[0] != OPENS_TAG])
def test_a_streams_events_build_the_whole_answers_blocks(start, mode, text):
    """A chat answer cut at 30 random places: its events replayed build the blocks the whole answer
    gets; the blocks hold the chat answer's reasoning, text and calls (their input), in order."""
    whole = ContentBlocks()
    segments_of(whole, start, mode, [text])
    rng = random.Random(11)
    for _ in range(30):
        blocks = ContentBlocks()
        events = segments_of(blocks, start, mode, _pieces(text, rng))
        assert _replay(events) == blocks.blocks
        assert [{k: v for k, v in b.items() if k != "id"} for b in blocks.blocks] == \
            [{k: v for k, v in b.items() if k != "id"} for b in whole.blocks]
    kinds = [block["type"] for block in whole.content()]
    if mode == "auto" and start == REASONING:
        assert kinds == ["thinking", "text", "tool_use", "tool_use"]
        assert [b["input"] for b in whole.blocks[2:]] == [{"a": 1, "b": 2}, {"text": "x"}]
        assert whole.blocks[0]["thinking"] == "think" and whole.blocks[1]["text"] == "Sure.\n"
    if mode == "named":
        assert kinds == ["tool_use"] and whole.blocks[0]["input"] == {"a": 482, "b": 356}
    if mode == "auto" and start is None:
        assert whole.content() == [{"type": "text", "text": text}]


def test_stop_reasons():
    use, text = [{"type": "tool_use"}], [{"type": "text"}]
    assert stop_reason("length", use, None, None) == ("max_tokens", None)  # the limit wins
    assert stop_reason("stop", use, None, None) == ("tool_use", None)  # a named call finishes as a stop
    assert stop_reason("tool_calls", use, None, None) == ("tool_use", None)
    assert stop_reason("stop", text, "##", ["##"]) == ("stop_sequence", "##")
    assert stop_reason("stop", text, "\nQ:", ["##"]) == ("end_turn", None)  # the template's end of turn
    assert stop_reason("stop", [], None, None) == ("end_turn", None)
    assert ContentBlocks().content() == [{"type": "text", "text": ""}]


@pytest.mark.parametrize(("ask", "param"), [
    ({"temperature": 0}, None), ({"temperature": 1}, None), ({"temperature": -0.1}, "temperature"),
    ({"metadata": {"user_id": "u-1"}}, None), ({"metadata": {"user_id": None}}, None),
    ({"metadata": {"user_id": 7}}, "metadata.user_id"), ({"metadata": {"tag": "a"}}, "metadata.tag"),
])
def test_a_messages_requests_own_fields_are_taken_at_their_edges_and_refused_by_name(ask, param):
    """Anthropic's temperature is in [0, 1], both ends taken; metadata holds a string user_id only."""
    if param is None:
        check_messages_request(_request(**ask))
        return
    with pytest.raises(ApiError) as refused:
        check_messages_request(_request(**ask))
    assert refused.value.param == param


@pytest.mark.parametrize(("budget", "refused"), [(1024, False), (2047, False), (2048, True), (1023, True),
                                                 ("2000", True), (True, True), (2000.0, True)])
def test_a_thinking_budget_is_an_integer_from_1024_to_under_max_tokens(budget, refused):
    """As Anthropic checks budget_tokens: an integer (not its text, a boolean or a decimal number)
    of at least 1,024 and less than max_tokens (2,048 here)."""
    ask = {"thinking": {"type": "enabled", "budget_tokens": budget}}
    if not refused:
        assert chat_body(_request(**ask))["thinking_token_budget"] == budget
        return
    with pytest.raises(ApiError) as caught:
        chat_body(_request(**ask))
    assert caught.value.param == "thinking.budget_tokens"


def test_thinking_not_displayed_is_generated_and_not_sent():
    """display "omitted": the model thinks (the template's enable_thinking), the reasoning is not sent
    (chat's include_reasoning false); displayed, chat's default sends it."""
    omitted = chat_body(_request(thinking={"type": "adaptive", "display": "omitted"}))
    assert omitted["chat_template_kwargs"] == {"enable_thinking": True}
    assert omitted["include_reasoning"] is False
    shown = chat_body(_request(thinking={"type": "adaptive", "display": "summarized"}))
    assert "include_reasoning" not in shown


def test_an_assistant_turn_of_calls_alone_or_of_no_blocks_is_still_a_message():
    """An assistant turn holding only tool_use blocks is an assistant message of those calls (its
    content ""), and a message of no blocks an empty one: neither is dropped from the conversation."""
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": [USE]},
                {"role": "user", "content": []}]
    assert chat_messages(None, messages) == [{"role": "user", "content": "q"},
                                             {"role": "assistant", "content": "", "tool_calls": [CALL]},
                                             {"role": "user", "content": ""}]


def test_a_tool_results_content_of_another_block_than_text_is_refused_by_its_type():
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": [USE]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                              "content": [{"type": "image", "source": {}}]}]}]
    with pytest.raises(ApiError) as refused:
        chat_messages(None, messages)
    assert refused.value.param == "messages[2].content[0].content[0].type"
    assert "a tool result of text only" in refused.value.message


def test_usage_counts_the_prompt_tokens_read_from_the_cache_apart():
    """Anthropic's input_tokens are the prompt's tokens not read from the cache; nothing is written
    to a cache a request pays for."""
    assert usage(10, 4, 3) == {"input_tokens": 6, "cache_creation_input_tokens": 0,
                               "cache_read_input_tokens": 4, "output_tokens": 3}


@pytest.mark.parametrize("block", ["Be brief.", {"type": "image", "source": {}}])
def test_a_system_block_that_is_no_text_block_is_refused_by_its_place(block):
    """`system` as a list holds text blocks only: a bare string in it, or a block of another type, is
    refused naming the block (not a 500, nor a missing 'text')."""
    with pytest.raises(ApiError) as refused:
        chat_messages([block], [{"role": "user", "content": "q"}])
    assert refused.value.param == "system[0]" and "expected a text block" in refused.value.message


def test_an_answer_of_no_blocks_streams_one_empty_text_block_at_index_0():
    """A message has at least one block: a stream where none began sends the empty text block that
    `content` gives, started and stopped at index 0."""
    blocks = ContentBlocks()
    events = blocks.at_least_one()
    assert [event["index"] for event in events] == [0, 0]
    assert _replay(events) == blocks.content() == [{"type": "text", "text": ""}]
