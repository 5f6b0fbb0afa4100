"""Reasoning outputs on /v1/chat/completions: a thinking model's `<think> ... </think>` block given
as `reasoning_content`, the text after it as `content` (and tool calls), as trtllm-serve, vLLM,
SGLang and DeepSeek's API answer. `trtspec serve --reasoning-parser qwen3` (or `deepseek_r1`).

Where the answer starts is read off the rendered prompt's tail (TensorRT-LLM's rule: prior turns'
blocks earlier in the prompt do not count):
- the prompt ends with `<think>` (DeepSeek-R1's, Qwen3-Thinking-2507's and Qwen3.5's templates
  open the block): the answer starts in reasoning;
- it ends with `</think>` (Qwen3's `enable_thinking: false` writes an empty block): all content;
- otherwise `qwen3` reads a `<think>` block only where the answer opens one (Qwen3's first
  templates, whose model writes the tag), and `deepseek_r1` reads the answer as reasoning up to
  `</think>`, a leading `<think>` dropped (R1-0528 writes it, R1 does not).
A block that never closes (max_tokens ran out) is all reasoning.

A guide (response_format, guided_*, a tool_choice's) holds the text after the reasoning, as vLLM
and SGLang apply structured outputs: the model's guide is the reasoning block (any text up to the
first `</think>`, then up to two newlines) followed by the request's guide, one grammar
(`reasoning_grammar`). Speculation stays lossless under it, as under any guide. Tool calls are
looked for in the content only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from trtspec.openai.tools import leading_tag, tag_prefix
from trtspec.spec.grammar import Guide, GuideError, guide_ebnf, structural_grammar

REASONING_PARSERS = ("qwen3", "deepseek_r1")  # trtspec serve --reasoning-parser (cli.py lists them too)
ALIASES = {"deepseek-r1": "deepseek_r1"}  # TensorRT-LLM's spelling of the same parser
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
PROMPT_TAIL = 64  # characters of the prompt's end that may hold the template's opened or closed block

# where an answer starts: in reasoning, in content, or as the parser reads its first text
REASONING, CONTENT, OPENS_TAG, OPTIONAL_TAG = "reasoning", "content", "opens_tag", "optional_tag"


def answer_start(parser: str, prompt: str) -> str:
    """Where `parser`'s answer to `prompt` (the rendered chat prompt) starts: REASONING (the
    template opened the block), CONTENT (it closed it), else OPENS_TAG (qwen3: reasoning only
    in a block the answer opens) or OPTIONAL_TAG (deepseek_r1: reasoning, a leading tag dropped)."""
    tail = prompt[-PROMPT_TAIL:].rstrip()
    if tail.endswith(THINK_CLOSE):
        return CONTENT
    if tail.endswith(THINK_OPEN):
        return REASONING
    return OPENS_TAG if parser == "qwen3" else OPTIONAL_TAG


@dataclass(slots=True)
class ReasoningParser:
    """One choice's text as (reasoning, content) pieces: `push` takes the text as it comes and
    holds back what may be a tag's start; `finish` flushes it."""

    state: str  # where the next text goes: one of answer_start's values
    held: str = ""

    def push(self, text: str) -> tuple[str, str]:
        self.held += text
        reasoning = content = ""
        if self.state in (OPENS_TAG, OPTIONAL_TAG):
            tagged = leading_tag(self.held, THINK_OPEN)
            if tagged is None:
                return "", ""  # whitespace, or what may be the tag: the answer's start decides
            if tagged:
                self.state, self.held = REASONING, self.held.lstrip()[len(THINK_OPEN):]
            else:
                self.state = CONTENT if self.state == OPENS_TAG else REASONING
        if self.state == REASONING:
            end = self.held.find(THINK_CLOSE)
            if end < 0:
                keep = tag_prefix(self.held, THINK_CLOSE)
                reasoning, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep:]
                return reasoning, ""
            reasoning, self.held = self.held[:end], self.held[end + len(THINK_CLOSE):]
            self.state = CONTENT
        if self.state == CONTENT:
            content, self.held = self.held, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What is held back at the text's end: in a block, reasoning; before the answer showed
        whether it opens one, qwen3's is content and deepseek_r1's reasoning."""
        held, self.held = self.held, ""
        if self.state in (REASONING, OPTIONAL_TAG):
            return held, ""
        return "", held


def reasoning_guide(guide: tuple[str, str], start: str) -> tuple[str, str]:
    """The model's guide for an answer that starts at `start` and whose text after the reasoning
    follows `guide` ((guide type, guide)): `guide` itself when the answer starts in content, else
    an ebnf_grammar guide of the reasoning block then `guide`. A GuideError says why it does not
    compile."""
    if start == CONTENT:
        return guide
    return "ebnf_grammar", reasoning_grammar(Guide(*guide), start)


@functools.lru_cache(maxsize=64)
def reasoning_grammar(guide: Guide, start: str) -> str:
    """EBNF of `start`'s reasoning block (any text up to the first `</think>`, then up to two
    newlines, as Qwen3 and DeepSeek-R1 end it), then `guide`'s language. XGrammar's structural tag."""
    from xgrammar.structural_tag import (
        AnyTextFormat,
        ConstStringFormat,
        GrammarFormat,
        OptionalFormat,
        SequenceFormat,
        TagFormat,
    )

    opener = THINK_OPEN if start == OPENS_TAG else ""
    block = SequenceFormat(elements=[TagFormat(begin=opener, content=AnyTextFormat(), end=THINK_CLOSE),
                                     GrammarFormat(grammar='root ::= "" | "\\n" | "\\n\\n"')])
    if start == OPTIONAL_TAG:
        block = SequenceFormat(elements=[OptionalFormat(content=ConstStringFormat(value=THINK_OPEN)), block])
    elif start == OPENS_TAG:
        block = OptionalFormat(content=block)
    elif start != REASONING:
        raise GuideError(f"no reasoning block starts at {start!r}")
    return structural_grammar(SequenceFormat(elements=[block, GrammarFormat(grammar=guide_ebnf(guide))]))


def lost_markers(tokenizer, markers: tuple[str, ...]) -> list[str]:
    """Of `markers`, those the served text would not show: trtspec decodes with special tokens
    skipped (as trtllm-serve and vLLM do by default), so a tokenizer that marks `<think>` special
    drops it from every answer, and a parser waiting for it never sees it. Qwen3's and
    DeepSeek-R1's tokenizers keep theirs as ordinary added tokens."""
    return [m for m in markers if m not in tokenizer.decode(tokenizer.encode(m, add_special_tokens=False))]


def parser_name(name: str | None) -> str | None:
    """The reasoning parser `name` is (TensorRT-LLM's `deepseek-r1` is trtspec's `deepseek_r1`)."""
    return None if name is None else ALIASES.get(name, name)
