"""Guided decoding (structured output): the target's text held to a JSON schema, a regular
expression or an EBNF grammar, losslessly under speculative decoding.

A guide masks p: at each position only the tokens that keep the text a prefix of the language
stay, and the end ids only where the text is complete. Like a penalty (`spec.penalties`) the mask
is a function of the tokens before the position, and at every position of a step the verifier
knows them: the committed tokens, then the drafts on the way there (a chain's x_1..x_j; a tree
node's ancestors and itself). So each position's p is the guided law the target alone would
sample from on that path, and the accept rule runs on it unchanged. A draft the grammar refuses
has p = 0 and is rejected (greedy: it is never the masked argmax; sampled: min(1, p/q) = 0), so
the positions after it are never reached and keep their logits unmasked.

Chain drafts are guided too (`choose_drafts`): each drafting step's logits are masked after the
row's drafts so far, so a draft is never one the guide refuses (JSON's forced `"`, `:` and
structure), and q is the masked law the draft was drawn from, which the accept rule needs and
which may be any law. Tree drafts are guided the same way, each node's children masked after its
path (`mask_paths`).

The grammar engine is XGrammar (Dong et al. 2024), the backend TensorRT-LLM's and vLLM's guided
decoding use: a matcher per request that accepts tokens, rolls them back, and fills the bitmask of
the tokens allowed next. Guide types and their names are TensorRT-LLM's
(`guided_decoding_guide_type`: json, json_schema, regex, ebnf_grammar).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trtspec import json_text

if TYPE_CHECKING:
    from trtspec.tokenizer import TextTokenizer

# TensorRT-LLM's guide types: what `text` of each holds
GUIDE_TYPES = {
    "json": "nothing: any JSON value (OpenAI's json_object)",
    "json_schema": "a JSON schema, as JSON text",
    "regex": "a regular expression the whole text matches",
    "ebnf_grammar": "an EBNF grammar (GBNF), its start rule `root`",
}
# a guide's text, at most: a tool_choice "required" guide over 60 tools is about 100,000 characters
MAX_GUIDE_CHARS = 1 << 20
# a JSON schema's nesting (objects and arrays in its JSON), at most: its grammar's cost grows about
# as the square of it (128: 0.08 s, 480: 4.5 s on the 2-core CPU, which a request would hold)
MAX_SCHEMA_DEPTH = 128
CONVERTED_CACHE = 256  # JSON schemas written out as grammars, kept (agents send the same tools each time)
COMPILED_CACHE = 64  # compiled guides a `GuideCompiler` keeps (a server's recurring schemas)


class GuideError(ValueError):
    """A guide that cannot be compiled; the message names the guide type and what is wrong."""


@dataclass(frozen=True, slots=True)
class Guide:
    """What a request's text must match (TensorRT-LLM's GuidedDecodingParams)."""

    kind: str  # one of GUIDE_TYPES
    text: str = ""  # the schema, regex or grammar ("" for json)

    def __post_init__(self) -> None:
        if self.kind not in GUIDE_TYPES:
            raise GuideError(f"guide type {self.kind!r} is not one of {', '.join(GUIDE_TYPES)}")
        if self.kind != "json" and not self.text:
            raise GuideError(f"a {self.kind} guide needs its text: {GUIDE_TYPES[self.kind]}")
        if len(self.text) > MAX_GUIDE_CHARS:
            raise GuideError(f"the {self.kind} guide has {len(self.text)} characters; "
                             f"at most {MAX_GUIDE_CHARS}")


def _xgrammar():
    try:
        import xgrammar
    except ImportError:  # a dependency of trtspec: only a hand-made environment lacks it
        raise GuideError("guided decoding needs the xgrammar package: pip install xgrammar") from None
    return xgrammar


def _byte_vocab(vocab_size: int) -> list[bytes]:
    """Each id's bytes for trtspec's byte-level tokenizer: ids 0-255 are bytes, the specials are
    empty (XGrammar never allows an empty token, save the stop tokens)."""
    return [bytes((i,)) if i < 256 else b"" for i in range(vocab_size)]


class GuideCompiler:
    """Compiles guides for one tokenizer, keeping the last COMPILED_CACHE compiled."""

    def __init__(self, tokenizer: TextTokenizer, vocab_size: int, end_ids: Iterable[int]):
        xgr = _xgrammar()
        end_ids = sorted(end_ids)
        hf = getattr(tokenizer, "hf", None)  # `HFTokenizer`'s; else trtspec's byte-level one
        if hf is not None:
            info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=end_ids)
        else:
            info = xgr.TokenizerInfo(_byte_vocab(vocab_size), xgr.VocabType.RAW, vocab_size=vocab_size,
                                     stop_token_ids=end_ids)
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.compile = functools.lru_cache(maxsize=COMPILED_CACHE)(self._compile)

    def _compile(self, guide: Guide):
        """The compiled grammar of `guide` (XGrammar's CompiledGrammar)."""
        c = self._compiler
        if guide.kind == "json_schema":
            schema_of(guide.text)
        try:
            if guide.kind == "json":
                return c.compile_builtin_json_grammar()
            if guide.kind == "json_schema":
                return c.compile_json_schema(guide.text)
            if guide.kind == "regex":
                return c.compile_regex(guide.text)
            return c.compile_grammar(guide.text)
        except Exception as exc:  # noqa: BLE001 - XGrammar raises RuntimeError/ValueError with its reason
            raise GuideError(f"the {guide.kind} guide does not compile: {_reason(exc)}") from None


def _reason(exc: Exception) -> str:
    """XGrammar's error without its C++ check's time and source line ("[15:41:02] /project/cpp/x.cc:94: "),
    which name nothing."""
    return re.sub(r"^\[[0-9:]+\] \S+:\d+: ", "", " ".join(str(exc).split()))


def compact_json_grammar(schema: dict) -> str:
    """An ebnf_grammar guide's text for JSON that follows `schema`, written compactly as
    `json.dumps` writes it (", " and ": " between items, no other whitespace; XGrammar's conversion
    with any_whitespace off). A json_schema guide allows any whitespace between tokens, which a model
    can fill without end."""
    return _compact_json_grammar(json.dumps(schema))


def schema_of(text: str) -> object:
    """A json_schema guide's schema; GuideError when its text is no JSON or nests deeper than
    MAX_SCHEMA_DEPTH."""
    try:
        schema = json_text.loads(text)
    except ValueError as exc:
        raise GuideError(f"the json_schema guide is not JSON: {exc}") from None
    deep = json_text.depth(schema)
    if deep > MAX_SCHEMA_DEPTH:
        raise GuideError(f"the JSON schema nests objects and arrays {deep} deep, more than the "
                         f"{MAX_SCHEMA_DEPTH} levels this server compiles")
    return schema


@functools.lru_cache(maxsize=CONVERTED_CACHE)
def _compact_json_grammar(schema: str) -> str:
    schema_of(schema)
    try:
        return str(_xgrammar().Grammar.from_json_schema(schema, any_whitespace=False))
    except Exception as exc:  # noqa: BLE001 - XGrammar raises RuntimeError/ValueError with its reason
        raise GuideError(f"the JSON schema does not compile: {_reason(exc)}") from None


# XGrammar's builtin JSON (a `json` guide, OpenAI's json_object): an object or an array
ANY_JSON = {"anyOf": [{"type": "object"}, {"type": "array"}]}


def compact_guide(kind: str, text: str) -> tuple[str, str]:
    """A json_schema or json guide as the same JSON written compactly (`compact_json_grammar`): an
    ebnf_grammar guide; other guides as they are."""
    if kind == "json":
        return "ebnf_grammar", compact_json_grammar(ANY_JSON)
    if kind != "json_schema":
        return kind, text
    return "ebnf_grammar", compact_json_grammar(schema_of(text))


def tagged_json_grammar(tags: Sequence[tuple[str, dict, str]], trigger: str, once: bool = False,
                        style: str = "json") -> str:
    """An ebnf_grammar guide's text for free text in which `trigger` opens one of `tags`, each
    (begin, schema, end): `begin` (which starts with the trigger), the arguments following `schema`,
    `end`; free text again after it, or with `once` the text's end. The arguments are JSON written
    compactly (`compact_json_grammar`), or with `style` "qwen_xml" Qwen3-Coder's
    `<parameter=NAME>\nVALUE\n</parameter>` lines (strings as they are, other values as JSON; a
    whitespace run between them of one character). XGrammar's structural tag (triggered tags),
    written out as EBNF."""
    keyed = tuple((begin, json.dumps(schema), end) for begin, schema, end in tags)
    return _tagged_json_grammar(keyed, trigger, once, style)


@functools.lru_cache(maxsize=CONVERTED_CACHE)
def _tagged_json_grammar(tags: tuple[tuple[str, str, str], ...], trigger: str, once: bool, style: str) -> str:
    """`tagged_json_grammar` of tags whose schemas are JSON text (a cache key)."""
    _xgrammar()
    from xgrammar.structural_tag import GrammarFormat, JSONSchemaFormat, TagFormat, TriggeredTagsFormat

    def arguments(schema: str):
        if style == "qwen_xml":
            return JSONSchemaFormat(json_schema=schema_of(schema), style="qwen_xml", max_whitespace_cnt=1)
        return GrammarFormat(grammar=_compact_json_grammar(schema))

    formats = [TagFormat(begin=begin, content=arguments(schema), end=end) for begin, schema, end in tags]
    return structural_grammar(TriggeredTagsFormat(triggers=[trigger], tags=formats, stop_after_first=once))


def guide_ebnf(guide: Guide) -> str:
    """`guide`'s language as EBNF text (an ebnf_grammar guide's text), as the model compiles it: a
    json_schema with any whitespace, XGrammar's JSON for json."""
    xgr = _xgrammar()
    if guide.kind == "json_schema":
        schema_of(guide.text)
    try:
        if guide.kind == "json":
            return str(xgr.Grammar.builtin_json_grammar())
        if guide.kind == "json_schema":
            return str(xgr.Grammar.from_json_schema(guide.text))
        if guide.kind == "regex":
            return str(xgr.Grammar.from_regex(guide.text))
        return str(xgr.Grammar.from_ebnf(guide.text))
    except Exception as exc:  # noqa: BLE001 - XGrammar raises RuntimeError/ValueError with its reason
        raise GuideError(f"the {guide.kind} guide does not compile: {_reason(exc)}") from None


def structural_grammar(fmt) -> str:
    """An ebnf_grammar guide's text for XGrammar's structural tag format `fmt` (a
    xgrammar.structural_tag format: sequence, tag, any_text, grammar, ...)."""
    xgr = _xgrammar()
    from xgrammar.structural_tag import StructuralTag

    try:
        return str(xgr.Grammar.from_structural_tag(StructuralTag(format=fmt)))
    except Exception as exc:  # noqa: BLE001 - XGrammar raises RuntimeError/ValueError with its reason
        raise GuideError(f"the structural grammar does not compile: {_reason(exc)}") from None


class GuideState:
    """One request's place in its grammar: XGrammar's matcher over the committed tokens, which
    walks each step's drafts and rolls them back (`mask`), then takes the emitted ones (`extend`)."""

    def __init__(self, compiled, end_ids: Iterable[int], vocab_size: int):
        xgr = _xgrammar()
        self._xgr = xgr
        self.vocab_size = vocab_size
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=sorted(end_ids))
        # special ids no text holds: refused here, as XGrammar would, without its warning per call
        self._special = frozenset(compiled.tokenizer_info.special_token_ids) - frozenset(end_ids)
        self._drafted = 0  # drafts of the proposal under way the matcher took (`take_draft`)
        self._draft_over = False  # a draft it refused, or an end id: the rest go unguided

    def mask_draft(self, logits: torch.Tensor) -> None:
        """Mask the logits [V] of the next draft after the committed tokens and the drafts taken."""
        if self._draft_over:
            return
        bitmask = self._xgr.allocate_token_bitmask(1, self.vocab_size)
        self.matcher.fill_next_token_bitmask(bitmask, 0)
        self._xgr.apply_token_bitmask_inplace(logits[None], bitmask.to(logits.device),
                                              vocab_size=self.vocab_size)

    def greedy_draft(self, logits: torch.Tensor, argmax: int) -> int:
        """The argmax of the next draft's logits [V] under the guide, taken: `argmax` (of the
        unmasked logits) itself when the guide allows it, the masked argmax being it then; else the
        argmax of the masked logits (a copy). One matcher step for most drafts instead of a mask."""
        return self.greedy_block(logits[None], [argmax])[0]

    def greedy_block(self, block: torch.Tensor, argmaxes: list[int]) -> list[int]:
        """`greedy_draft` for a block's slots one after another: each slot's draft under the guide
        after the drafts before it.  block [k, V], argmaxes: each slot's unmasked argmax -> [k]"""
        drafts = list(argmaxes)
        for j, argmax in enumerate(argmaxes):
            if self._draft_over:
                break
            if self._accept(argmax):
                self._drafted += 1
                self._draft_over = self.matcher.is_terminated()
                continue
            masked = block[j].clone()
            self.mask_draft(masked)
            drafts[j] = int(masked.argmax())
            self.take_draft(drafts[j])
        return drafts

    def take_draft(self, token: int) -> None:
        """Advance past a draft, so the next one is masked after it (`end_drafts` rolls them back)."""
        if self._draft_over:
            return
        if not self._accept(token):  # refused: what follows it is never verified
            self._draft_over = True
            return
        self._drafted += 1
        self._draft_over = self.matcher.is_terminated()  # an end id: nothing follows it

    def end_drafts(self) -> None:
        """Roll the proposal's drafts back: the matcher stands after the committed tokens again."""
        if self._drafted:
            self.matcher.rollback(self._drafted)
        self._drafted, self._draft_over = 0, False

    def allowed_prefix(self, tokens: Sequence[int]) -> list[int]:
        """The longest prefix of `tokens` the guide allows after the committed ones (an end id that
        ends the text last): a copied draft chain cut where the first draft would be refused. The
        matcher is left where it stood (no proposal may be under way: `take_draft` walks it)."""
        for token in tokens:
            if self._draft_over:  # refused, or after an end id
                break
            self.take_draft(token)
        allowed = list(tokens[: self._drafted])
        self.end_drafts()
        return allowed

    def _accept(self, token: int) -> bool:
        """Move the matcher past `token` if the guide allows it there."""
        return token not in self._special and self.matcher.accept_token(token)

    def extend(self, tokens: Sequence[int]) -> None:
        """Take emitted tokens. Each was allowed by the mask it was chosen under (an end id ends
        the request: nothing after it is emitted)."""
        for token in tokens:
            if self.matcher.is_terminated():
                break
            if not self.matcher.accept_token(int(token)):
                raise RuntimeError(f"token {token} was emitted against the request's guide")

    def allowed(self) -> torch.Tensor:
        """The tokens the guide allows after the committed ones.  -> [V] bool"""
        logits = torch.zeros(1, self.vocab_size)
        self.mask(logits)
        return logits[0] == 0

    def mask(self, logits: torch.Tensor, fed: torch.Tensor | None = None,
             parents: Sequence[int] | None = None) -> None:
        """Mask a step's logits in place.  logits [s, V], position j's predicting the token after the
        committed ones and the drafts on its path; fed [≥ s − 1]: the drafts after the last committed
        token (a chain's x_1.., a tree's nodes 1..), parents: a tree row's (`DraftTree.row_parents`).
        Positions after a draft the grammar refuses are unreachable and stay unmasked."""
        self.apply(logits, self.fill(logits.shape[0], fed, parents))

    def fill(self, s: int, fed: torch.Tensor | None = None, parents: Sequence[int] | None = None
             ) -> torch.Tensor:
        """A step's bitmask for `mask`, from the drafts alone (the logits are not needed: the decoder
        fills it on another thread while the target's forward runs; XGrammar lets go of the GIL).
        Leaves the matcher where it stood.  -> [s, ⌈V/32⌉] int32"""
        bitmask = self._xgr.allocate_token_bitmask(s, self.vocab_size)  # all allowed
        self.matcher.fill_next_token_bitmask(bitmask, 0)
        if s > 1 and fed is not None:
            children: list[list[int]] = [[] for _ in range(s)]
            for j in range(1, s if parents is None else min(s, len(parents))):  # a tree row: its nodes
                children[j - 1 if parents is None else parents[j]].append(j)
            self._visit(0, children, fed[: s - 1].tolist(), bitmask)
        return bitmask

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        """Mask logits [s, V] in place with a bitmask of `fill`."""
        self._xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=self.vocab_size)

    def mask_paths(self, scores: torch.Tensor, paths: Sequence[Sequence[int]]) -> None:
        """Mask tree candidates' children in place: row f of scores [F, V] scores the tokens after the
        committed ones and paths[f] (a frontier node's drafts from the root). A path the guide
        refuses, or that ends in an end id, has no children: its row is all −inf. The matcher is
        left where it stood."""
        bitmask = self._xgr.allocate_token_bitmask(len(paths), self.vocab_size)
        dead = []
        for f, path in enumerate(paths):
            taken = 0
            for token in path:
                if self.matcher.is_terminated() or not self._accept(token):
                    break
                taken += 1
            if taken == len(path) and not self.matcher.is_terminated():
                self.matcher.fill_next_token_bitmask(bitmask, f)
            else:
                dead.append(f)
            if taken:
                self.matcher.rollback(taken)
        self._xgr.apply_token_bitmask_inplace(scores, bitmask.to(scores.device), vocab_size=self.vocab_size)
        if dead:
            scores[dead] = float("-inf")

    def _visit(self, node: int, children: list[list[int]], tokens: list[int], bitmask: torch.Tensor) -> None:
        """Fill the rows of `node`'s descendants, depth first from where the matcher stands (after
        `node`'s path), and leave it there. A refused draft, or an end id, ends its branch."""
        matcher = self.matcher
        for child in children[node]:
            if not self._accept(tokens[child - 1]):
                continue  # p(token) = 0: never accepted, its subtree never reached
            if not matcher.is_terminated():  # an end id ends the request: nothing follows it
                matcher.fill_next_token_bitmask(bitmask, child)
                self._visit(child, children, tokens, bitmask)
            matcher.rollback(1)


def choose_drafts(logits: torch.Tensor, rows: Sequence, depth: int
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`choose_tokens` for one drafting step of `rows` (`DraftRow`s), each guided row's draft chosen
    under its guide after its drafts so far, and taken: a sampling row's logits are masked first (q
    is the masked law), a greedy row's draft is the masked argmax (`GuideState.greedy_draft`).
    logits [R, V] (not written) -> tokens [R], q [R, V] or None (`choose_tokens`)."""
    from trtspec.spec.sampling import choose_tokens

    guided = [r for r, row in enumerate(rows) if row.grammar is not None]
    sampled = [r for r in guided if not rows[r].sampling.greedy]
    if sampled:
        logits = logits.clone()
        for r in sampled:
            rows[r].grammar.mask_draft(logits[r])
    tokens, q = choose_tokens(logits, [row.sampling for row in rows], [row.generator for row in rows],
                              [row.position(depth) for row in rows])
    for r in guided:
        if r in sampled:
            rows[r].grammar.take_draft(int(tokens[r]))
            continue
        tokens[r] = rows[r].grammar.greedy_draft(logits[r], int(tokens[r]))
        if q is not None:  # a greedy row's q beside sampling rows: one-hot on its draft, as choose_tokens's
            q[r] = torch.nn.functional.one_hot(tokens[r], q.shape[-1]).to(q.dtype)
    return tokens, q
