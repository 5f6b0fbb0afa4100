"""Reasoning outputs' pieces without a server (`trtspec.openai.reasoning`): where an answer starts,
read off the prompt's tail; the parser's (reasoning, content) pieces, streamed in random pieces,
join to the whole text's; the guide after the reasoning block takes what the parser reads as a
block then the request's guide, and nothing else; assistant messages carry their reasoning to the
chat template. Served reasoning is in test_openai."""

from __future__ import annotations

import json
import random
import re

import pytest

from trtspec.openai.frontend import Frontend
from trtspec.openai.protocol import ApiError, ChatRequest, check_messages, parse
from trtspec.openai.reasoning import (
    ALIASES,
    CONTENT,
    OPENS_TAG,
    OPTIONAL_TAG,
    REASONING,
    REASONING_PARSERS,
    THINK_OPEN,
    ReasoningParser,
    answer_start,
    parser_name,
    reasoning_guide,
)
from trtspec.openai.tools import tool_plan
from trtspec.spec.grammar import GuideError

from .test_tools import TOOLS, _accepts, _pieces

QWEN3_OFF = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.mark.parametrize(("parser", "prompt", "start"), [
    ("qwen3", "<|im_start|>assistant\n<think>\n", REASONING),  # Qwen3-Thinking-2507, Qwen3.5
    ("deepseek_r1", "<｜Assistant｜><think>\n", REASONING),  # DeepSeek-R1's template
    ("qwen3", QWEN3_OFF, CONTENT),  # enable_thinking false: an empty block
    ("deepseek_r1", QWEN3_OFF, CONTENT),
    ("qwen3", "<|im_start|>assistant\n", OPENS_TAG),  # Qwen3's first templates: the model writes it
    ("deepseek_r1", "Q: 1 + 2\nA: ", OPTIONAL_TAG),
    # an earlier turn's block does not count: only the prompt's tail
    ("qwen3", "<think>\nr</think>\n\n3<|im_end|>\n<|im_start|>user\nand?<|im_end|>\n<|im_start|>assistant\n",
     OPENS_TAG),
])
def test_where_the_answer_starts_is_read_off_the_prompts_tail(parser, prompt, start):
    assert answer_start(parser, prompt) == start


CASES = [  # where it starts, the answer, (reasoning, content)
    (REASONING, "abc</think>\n\nthe answer", ("abc", "\n\nthe answer")),
    (REASONING, "a </th b < c</think>", ("a </th b < c", "")),
    (REASONING, "x</think>y</think>z", ("x", "y</think>z")),  # the first close ends the block
    (REASONING, "cut by max_tokens </thi", ("cut by max_tokens </thi", "")),
    (CONTENT, "a<think>b</think>c", ("", "a<think>b</think>c")),
    (OPENS_TAG, "<think>r</think>\n\nc", ("r", "\n\nc")),
    (OPENS_TAG, " \n<think>r</think>c", ("r", "c")),
    (OPENS_TAG, "an answer <think>x</think>", ("", "an answer <think>x</think>")),
    (OPENS_TAG, "  <thin", ("", "  <thin")),  # what might have opened a block, at the end: content
    (OPENS_TAG, "<think>never closed", ("never closed", "")),
    (OPTIONAL_TAG, "<think>r</think>c", ("r", "c")),
    (OPTIONAL_TAG, "  r</think>c", ("  r", "c")),
    (OPTIONAL_TAG, "<thin", ("<thin", "")),  # deepseek_r1: reasoning until </think>
    (OPTIONAL_TAG, "no end", ("no end", "")),
]


@pytest.mark.parametrize(("start", "text", "want"), CASES)
def test_the_answer_splits_into_reasoning_and_content_however_it_is_cut(start, text, want):
    rng = random.Random(hash(text) % 1000)
    for _ in range(40):
        parser, got = ReasoningParser(start), ["", ""]
        for piece in _pieces(text, rng):
            for k, part in enumerate(parser.push(piece)):
                got[k] += part
        for k, part in enumerate(parser.finish()):
            got[k] += part
        assert tuple(got) == want


def test_text_is_given_out_as_soon_as_no_tag_can_begin_in_it():
    """Held back: only a tail that may begin `</think>` (or, at an answer's start, `<think>`)."""
    parser = ReasoningParser(REASONING)
    assert parser.push("step one <") == ("step one ", "")
    assert parser.push("b> two </th") == ("<b> two ", "")
    assert parser.push("ink>\n\n{") == ("", "\n\n{")
    assert parser.push('"a": 1}') == ("", '"a": 1}')
    qwen = ReasoningParser(OPENS_TAG)
    assert qwen.push("  <th") == ("", "") and qwen.push("is") == ("", "  <this")


REGEX = ("regex", "[a-z]+")


@pytest.mark.parametrize(("start", "accepted", "refused"), [
    (REASONING, ["any < text at all</think>\n\nabc", "x</think>abc", "</think>\nabc"],
     ["abc", "x</think>ABC", "x</think>\n\n\nabc", "x</think>"]),
    (OPENS_TAG, ["abc", "<think>r</think>\nabc", "<think></think>abc"], ["r</think>abc", "<think>r"]),
    (OPTIONAL_TAG, ["r</think>abc", "<think>r</think>\n\nabc"], ["abc", "<think>abc"]),
])
def test_the_guide_holds_the_text_after_the_reasoning(start, accepted, refused):
    """The model's guide: the reasoning block as the parser reads it (any text up to the first
    `</think>`, up to two newlines), then the request's guide; and what it takes, the parser reads
    as a block whose content is the request guide's."""
    kind, grammar = reasoning_guide(REGEX, start)
    assert kind == "ebnf_grammar"
    for text in accepted:
        assert _accepts(grammar, text), text
        parser = ReasoningParser(start)
        reasoning, content = (a + b for a, b in zip(parser.push(text), parser.finish(), strict=True))
        assert re.fullmatch(r"\n{0,2}[a-z]+", content), (text, reasoning, content)
    for text in refused:
        assert not _accepts(grammar, text), text
    assert reasoning_guide(REGEX, CONTENT) == REGEX  # an answer in content: the guide as it was


def test_json_and_tool_guides_follow_the_reasoning_too():
    schema = ("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "integer"}},
                                         "required": ["a"]}))
    grammar = reasoning_guide(schema, REASONING)[1]
    assert _accepts(grammar, 'think: {"a": 1}?</think>\n\n{"a": 2}')
    assert not _accepts(grammar, 'r</think>{"a": "x"}')
    assert _accepts(reasoning_guide(("json", ""), REASONING)[1], "r</think>[1, 2]")
    named = tool_plan(TOOLS, {"type": "function", "function": {"name": "add"}}, None, None).guide
    grammar = reasoning_guide(named, OPENS_TAG)[1]
    assert _accepts(grammar, '<think>add them</think>\n\n{"a": 1, "b": 2}')
    assert _accepts(grammar, '{"a": 1, "b": 2}') and not _accepts(grammar, '{"a": 1,  "b": 2}')


def _hi(**body) -> ChatRequest:
    """A chat request saying "hi", with `body`'s parameters."""
    return parse(ChatRequest, {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body})


def test_a_thinking_budget_opens_the_block_where_the_answer_must_and_needs_a_reasoning_parser():
    """thinking_token_budget, 0 included (the block closed at once), is (tokens, what opens the block
    at the answer's start): nothing where the prompt opened it, <think> where the answer may; none
    where the template closed the block or no budget was asked; a negative one, or one on a server
    without --reasoning-parser (start None), refused by name."""
    assert Frontend.thinking(_hi(thinking_token_budget=0), REASONING) == (0, "")
    assert Frontend.thinking(_hi(thinking_token_budget=5), OPENS_TAG) == (5, THINK_OPEN)
    assert Frontend.thinking(_hi(thinking_token_budget=5), CONTENT) is None
    assert Frontend.thinking(_hi(), REASONING) is None and Frontend.thinking(_hi(), None) is None
    for budget, start, code in ((5, None, "unsupported_value"), (-1, REASONING, "invalid_value")):
        with pytest.raises(ApiError) as refused:
            Frontend.thinking(_hi(thinking_token_budget=budget), start)
        assert (refused.value.param, refused.value.code) == ("thinking_token_budget", code)


def test_a_requests_guide_is_compact_as_the_server_says_unless_it_says_itself_and_none_stays_none():
    """A JSON guide is written compactly by the server's --compact-json (`compact`) where the
    request does not say (structured_outputs.disable_any_whitespace), as the request says where it
    does; a request without a guide has none, after a reasoning block too; the guide's parameter is
    a named tool choice's, else the request's own."""
    json = {"response_format": {"type": "json_object"}}
    loose = Frontend.guide(_hi(**json), None, None)
    assert Frontend.guide(_hi(**json), None, None, compact=True) != loose
    said = _hi(**json, structured_outputs={"disable_any_whitespace": False})
    assert Frontend.guide(said, None, None, compact=True) == loose
    bare = _hi()
    assert Frontend.guide(bare, None, REASONING) is None and Frontend.guide_param(bare, None) is None
    assert Frontend.guide_param(_hi(**json), None) == "response_format"
    named = tool_plan(TOOLS, {"type": "function", "function": {"name": "add"}}, None, None)
    assert Frontend.guide_param(_hi(**json), named) == named.param


def test_a_guide_that_does_not_compile_is_refused_naming_its_parameter():
    with pytest.raises(GuideError, match="regex"):
        reasoning_guide(("regex", "(unclosed"), REASONING)
    for body, param in [({"guided_regex": "(unclosed"}, "guided_regex"),
                        ({"response_format": {"type": "json_schema", "json_schema": {
                            "name": "x", "schema": {"type": "object", "properties": 3}}}},
                         "response_format")]:
        req = _hi(**body)
        assert Frontend.guide(req, None, CONTENT) is not None  # in content the model checks it, as before
        with pytest.raises(ApiError) as refused:
            Frontend.guide(req, None, REASONING)
        assert refused.value.param == param, refused.value.message


def test_assistant_messages_carry_their_reasoning_to_the_template():
    """As clients send an answer back (DeepSeek's and trtllm-serve's reasoning_content, vLLM's newer
    reasoning); Qwen3's template reads message.reasoning_content. Another role's is refused."""
    for key in ("reasoning_content", "reasoning"):
        req = parse(ChatRequest, {"model": "m", "messages": [
            {"role": "user", "content": "1 + 2"}, {"role": "assistant", "content": "3", key: "add them"}]})
        assert check_messages(req.messages, None)[1] == {"role": "assistant", "content": "3",
                                                         "reasoning_content": "add them"}
        req = parse(ChatRequest, {"model": "m", "messages": [{"role": "user", "content": "1", key: "r"}]})
        with pytest.raises(ApiError) as refused:
            check_messages(req.messages, None)
        assert refused.value.param == f"messages[0].{key}"


def test_serve_offers_every_reasoning_parser():
    """cli.py lists the parsers itself (it imports no heavy module at start-up): the same ones."""
    from trtspec.cli import serve

    option = next(p for p in serve.params if p.name == "reasoning_parser")
    assert tuple(option.type.choices) == REASONING_PARSERS + tuple(ALIASES)


def test_a_parsers_other_spelling_is_the_same_parser():
    """serve takes TensorRT-LLM's spelling too: `deepseek-r1` is the deepseek_r1 parser, each
    parser's own name is itself, and no --reasoning-parser stays none."""
    assert parser_name("deepseek-r1") == "deepseek_r1"
    assert [parser_name(name) for name in REASONING_PARSERS] == list(REASONING_PARSERS)
    assert parser_name(None) is None


NAMED = {"type": "function", "function": {"name": "add"}}


@pytest.mark.parametrize("plan", [tool_plan(TOOLS, "auto", None, "hermes"),
                                  tool_plan(TOOLS, NAMED, None, None)])
def test_tool_calls_are_read_in_the_content_only(plan):
    """A choice's deltas (`Choice.deltas`, what streamed and whole answers are built from): the block
    as reasoning_content, a `<tool_call>` written inside it is reasoning, the calls come from the
    content; however the text is cut."""
    from trtspec.openai.choice import Choice
    from trtspec.openai.tools import merge_deltas
    from trtspec.openai.triton_stream import Generation

    call = '{"a": 1, "b": 2}'
    after = f'\n\n<tool_call>\n{{"name": "add", "arguments": {call}}}\n</tool_call>' if plan.mode == "auto" \
        else f"\n\n{call}"
    reasoning = 'Call <tool_call>{"name": "add"} with 1 and 2.'
    text = reasoning + "</think>" + after
    rng = random.Random(7)
    for _ in range(20):
        run = Choice(Generation("", 64), [], tools=plan, start=REASONING)
        pieces = _pieces(text, rng)
        deltas = [d for k, piece in enumerate(pieces) for d in run.deltas(piece, k == len(pieces) - 1)]
        said = "".join(d["reasoning_content"] for d in deltas if "reasoning_content" in d)
        message = merge_deltas([d for d in deltas if "reasoning_content" not in d])
        assert said == reasoning
        (got,) = message["tool_calls"]
        assert got["function"]["name"] == "add"
        assert json.loads(got["function"]["arguments"]) == {"a": 1, "b": 2}


def test_a_tokenizer_that_drops_the_tags_is_refused_naming_the_flag(tmp_path):
    """Served text skips special tokens: a tokenizer whose `<think>` or `<tool_call>` is one would
    hide the tags from the parsers, and the frontend says so (added as ordinary tokens, as Qwen3's
    and DeepSeek-R1's are, they pass); the byte-level tokenizer shows every tag."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AddedToken, PreTrainedTokenizerFast

    from trtspec.errors import ConfigError
    from trtspec.openai.model_info import ServedModel, check_parser_markers
    from trtspec.openai.reasoning import THINK_OPEN, lost_markers
    from trtspec.tokenizer import ByteTokenizer, HFTokenizer

    def tokenizer(special: bool) -> HFTokenizer:
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        bpe = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(alphabet)}, merges=[]))
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        hf = PreTrainedTokenizerFast(tokenizer_object=bpe)
        hf.add_tokens([AddedToken(tag, special=special) for tag in ("<think>", "</think>", "<tool_call>")])
        wrapped = HFTokenizer.__new__(HFTokenizer)
        wrapped.hf = hf
        return wrapped

    assert lost_markers(tokenizer(False), (THINK_OPEN, "</think>")) == []
    assert lost_markers(tokenizer(True), (THINK_OPEN, "</think>")) == [THINK_OPEN, "</think>"]
    assert lost_markers(ByteTokenizer(), (THINK_OPEN, "<tool_call>")) == []
    for parsers, flag in [(("hermes", None), "--tool-call-parser hermes"),
                          ((None, "qwen3"), "--reasoning-parser qwen3")]:
        model = ServedModel("m", tokenizer(True), None, 64, 8, 300, tool_parser=parsers[0],
                            reasoning_parser=parsers[1])
        with pytest.raises(ConfigError, match=flag):
            check_parser_markers(model, tmp_path)
        check_parser_markers(ServedModel("m", tokenizer(False), None, 64, 8, 300, tool_parser=parsers[0],
                                         reasoning_parser=parsers[1]), tmp_path)
    # llama3_json reads no tag that must survive: <|python_tag|> is special in Llama 3.1, and optional
    llama = ServedModel("m", tokenizer(True), None, 64, 8, 300, tool_parser="llama3_json")
    check_parser_markers(llama, tmp_path)
