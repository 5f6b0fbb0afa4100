"""Certify a served deployment as lossless against its target alone.

1. Greedy: every prompt's served `output_ids` must equal the target's own greedy decoding
   (`--drafter none` path, in the config's flavour) token for token. An OpenAI-compatible
   server (`openai://`, any of trtspec, trtllm-serve, vLLM, SGLang) sends text, not ids: its text
   must equal the decoded reference character for character. Where they differ, the served tokens
   are audited (`trtspec.spec.near_ties`, the checkpoint in torch in the config's dtype): a
   bfloat16/float16 deployment may part from plain decoding at a near-tie of the target's two best
   tokens and still be greedy up to rounding, which passes, and says so; any token off the
   target's argmax by more than its rounding noise fails.
2. Sampling: for one prompt (of those given, the one whose first `steps` tokens the target is least
   sure of: the largest summed entropy of their exact laws, so the test has something to measure;
   a prompt whose tokens are near-certain passes any server), n requests with seeds 0..n-1 under
   `SAMPLING` (temperature 1.3, top-k 3, top-p 0.9: a temperature other than 1 and a binding top-p,
   so a deployment that applies either wrongly, or not at all, changes the law), each
   `SAMPLE_TOKENS` long (8 or 3 by seed) so that the first tokens pass through the verifier's
   acceptance rule and, in the short ones, its bonus token; the empirical law of each of the
   first `steps` tokens is compared with the exact marginal law of the processed target
   distribution, computed by walking the target's top-k tree with the checkpoint loaded in torch
   (whatever the flavour served, so an engine deployment is held to the model it was exported
   from). The statistic is each position's total-variation distance, its p-value simulated from
   the exact law (`trtspec.spec.law_check`), the positions tested together (Bonferroni).
   The same n requests are sent twice more: under a regex guide that bars the first character of
   the likeliest first token (`barring_guide`; the law is the guided target's, the checkpoint
   masked after each path), and under penalties, min-p and a logit bias against that token
   (`processed_sampling`), and a fourth time under bad words and a reasoning budget
   (`restriction_of`: the text of the likeliest first two tokens banned as a bad word; a block
   opened by the likeliest first token, whose budget of `BUDGET` token forces the third token
   to its end on the paths that take it, not on the others; over openai:// the bad word alone,
   since /v1/completions takes no budget). Bad words and the budget act at draft positions along
   each draft's own path, so the law of tokens 2 and 3 tests them where speculation could err.
   The four laws are tested at `ALPHA` / `LAWS` each: a correct deployment fails with
   probability at most `ALPHA`. n must be at least `MIN_SAMPLES`.
   Choosing the prompt walks the exact laws of the first `SAMPLING_CANDIDATES` given.
   OpenAI servers' texts are tokenized with the reference's tokenizer where that is exact (the
   byte-level models). With any other tokenizer a text is not tokenized again (a BPE text sampled
   in a non-canonical split tokenizes into other ids, and encoding adds the tokenizer's BOS): every
   request is `steps` tokens long and the law of its whole text is compared with the exact one,
   the walked joint law of the `steps` tokens pushed through `streamed_text` (`text_law`).
3. Seeded samples, for a deployment that samples with Gumbel coupling (`sampling.coupling:
   gumbel` in the config): every prompt once more at temperature 1, seed COUPLED_SEED + i; the
   served sample must equal, token for token (character for character over OpenAI), what the
   target alone samples with that seed (`trtspec.spec.coupling`): the greedy check, for sampling,
   audited the same way where they differ (a coupled sample is the argmax of log p + g).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from trtspec.config import BuildConfig
from trtspec.models.target import load_causal_lm
from trtspec.pipeline import load_pipeline
from trtspec.spec.grammar import Guide, GuideState
from trtspec.spec.law_check import SIMULATIONS, LawCheck, check_law
from trtspec.spec.near_ties import GreedyAudit, GreedyJudge, parted_by_length, shared_prefix
from trtspec.spec.penalties import penalized
from trtspec.spec.sampling import SamplingParams, probs_from_logits
from trtspec.tokenizer import ByteTokenizer
from trtspec.triton.client import (
    ClientError,
    Completion,
    GenerateParams,
    generate,
    grpc_generate_many,
    grpc_inputs,
    split_url,
)
from trtspec.triton.request import THINK_END, TextStream, context_of, tokenized

DEFAULT_PROMPTS = (
    "Q: 482 + 356\nA:",
    "Q: 34 * 8\nA:",
    "def parse(self, text):\n",
    "import os\n",
    "Explain what a generator is and when to use one.",
)
SAMPLING = SamplingParams(temperature=1.3, top_k=3, top_p=0.9)
# greedy under penalties: the target's own text under them (`spec.penalties`), held to the target alone's
PENALIZED = SamplingParams(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2)
# greedy under a guide: the guided target's own text (`spec.grammar`), held to the target alone's
GUIDED = Guide("json_schema", json.dumps({"type": "object", "properties": {
    "answer": {"type": "string"}, "steps": {"type": "array", "items": {"type": "integer"}}},
    "required": ["answer"]}))
# Tokens per sampling request, by seed parity. The first token comes from the prefill; a request's
# drafts are capped by what it has left, so in an 8-token request tokens 2 and 3 are drafts 1 and 2
# of a 6-draft chain (accepted or recovered) and a bonus token can only be its last; in a 3-token
# request token 3 is the bonus after draft 1. The first tokens' law is the same for both lengths.
SAMPLE_TOKENS = (8, 3)
PROCESSED_MIN_P, PROCESSED_BIAS = 0.2, -1.0  # the third sampled law's min-p and logit bias
STEPS = 3  # generated tokens whose law the sampling test compares
ALPHA = 1e-3  # probability that a correct server fails the sampling tests (all laws and positions together)
LAWS = 4  # sampled laws tested (plain, guided, processed, restricted), each at ALPHA / LAWS (Bonferroni)
BUDGET = 1  # the restricted law's reasoning budget: one token inside the block, then its end forced
DEFAULT_SAMPLES = 2000  # docs/EVAL.md: what this many requests catch, and what 400 missed
MIN_SAMPLES = 100  # fewer miss a law moved by 0.2 in total variation more often than not (docs/EVAL.md)
MAX_SAMPLES = 1_000_000  # requests per sampling test, at most (a few hours on this CPU)
SAMPLING_CANDIDATES = 8  # prompts whose exact laws are walked to pick the sampled one (~top_k^steps forwards)
COUPLED_SEED = 100  # Gumbel coupling: prompt i's seeded sample uses seed COUPLED_SEED + i


@dataclass(slots=True)
class GreedyCheck:
    """One served text against the target alone's: greedy, or a Gumbel-coupled sample (`seed`)."""

    prompt: str
    identical: bool
    first_difference: int | None  # index of the first differing token (character, for text)
    served_tau: float | None  # None: the server reports no draft figures
    unit: str = "token"
    audit: GreedyAudit | None = None  # the served tokens audited where they differ
    seed: int | None = None  # a coupled sample's seed; None: greedy
    penalized: bool = False  # greedy under PENALIZED's penalties
    guided: bool = False  # greedy under the GUIDED guide
    lengths: tuple[int, int] | None = None  # (served, target alone's) where they part only by length

    @property
    def passed(self) -> bool:
        explained = self.lengths is None and self.audit is not None and self.audit.near_ties_only
        return self.identical or explained

    def lines(self) -> list[str]:
        if self.identical:
            verdict = "identical"
        else:
            verdict = f"{'differs' if self.passed else 'MISMATCH'} at {self.unit} {self.first_difference}"
        kind, seed = ("greedy ", "") if self.seed is None else ("sampled", f"  seed {self.seed}")
        kind = "penalty" if self.penalized else "guided " if self.guided else kind
        tau = "–" if self.served_tau is None else f"{self.served_tau:.2f}"
        out = [f"{kind} {verdict:<24} tau={tau}{seed}  {self.prompt[:40]!r}"]
        if self.lengths is not None:
            served, alone = self.lengths
            out.append(f"        served {served} {self.unit}s, the target alone {alone}: one ends where the "
                       "other goes on, which no near-tie explains")
        elif self.audit is not None:
            out.append(f"        served tokens: {self.audit.describe()}")
        return out


@dataclass(frozen=True, slots=True)
class Restriction:
    """The fourth sampled law's bad words and reasoning budget, as a request sends them (text)."""

    bad_words: tuple[str, ...] = ()
    thinking: tuple[int, str, str] | None = None  # (budget, start, end): the thinking_* inputs

    def sampling(self, base: SamplingParams, tokenizer) -> SamplingParams:
        """`base` with these in token ids, as the served model tokenizes them (`request.tokenized`)."""
        encode = functools.partial(tokenizer.encode, add_special_tokens=False)
        return tokenized(base, encode, self.bad_words, self.thinking)

    def describe(self) -> str:
        out = "".join(f", bad word {word!r}" for word in self.bad_words)
        if self.thinking is not None:
            budget, start, end = self.thinking
            out += f", reasoning budget {budget} in a block opened by {start!r}, ended by {end!r}"
        return out


@dataclass(slots=True)
class SamplingCheck:
    """Seeded sampled requests of one prompt: the law of their first tokens against the exact one."""

    prompt: str
    samples: int
    law: LawCheck
    sampling: SamplingParams = SAMPLING
    drafted: int | None = None  # draft tokens the server reports for these requests; None: not reported
    text_of: int | None = None  # the law tested is of whole texts this many tokens long; None: of tokens
    guide: Guide | None = None  # the requests' guide (the law is the guided target's)
    restriction: Restriction | None = None  # the requests' bad words and reasoning budget

    @property
    def passed(self) -> bool:
        return self.law.passed

    def lines(self) -> list[str]:
        s, law = self.sampling, self.law
        if self.text_of is None:
            what, each, unit = f"the first {len(law.positions)} tokens", "", "a token"
        else:
            what, each = f"the text of {self.text_of}-token requests", f" of {self.text_of} tokens"
            unit = "the text"
        under = "" if self.guide is None else f", guided by {self.guide.kind} {self.guide.text!r}"
        if s.min_p:
            under += f", min-p {s.min_p:g}"
        if s.presence_penalty or s.frequency_penalty or s.repetition_penalty != 1.0:
            under += (f", presence {s.presence_penalty:g}, frequency {s.frequency_penalty:g}, repetition "
                      f"{s.repetition_penalty:g}")
        under += "".join(f", logit_bias {{{token}: {bias:g}}}" for token, bias in s.logit_bias)
        if self.restriction is not None:
            under += self.restriction.describe()
        out = [f"sample  law of {what} of {self.prompt[:40]!r} (the prompt they are least certain after): "
               f"{self.samples} requests{each}, seeds 0..{self.samples - 1}, "
               f"temperature {s.temperature:g}, top-k {s.top_k}, top-p {s.top_p:g}{under}",
               f"sample  statistic: total variation from the exact law; p-value from {SIMULATIONS} "
               f"simulated samples of that law; {unit} fails at p ≤ {law.level:.2g} (alpha {law.alpha:g} "
               f"over {len(law.positions)} {'tokens' if self.text_of is None else 'text'}, Bonferroni)"]
        for pos, t in enumerate(law.positions):
            if self.text_of is None:
                name, kind = f"token {pos + 1}", "tokens"
            else:
                name, kind = "text", "texts"
            outside = f", {t.outside} draws of {kind} the target never samples" if t.outside else ""
            out.append(f"sample  {name}: TV {t.tv:.4f}, p {t.p_value:.2g} ({t.draws} draws, "
                       f"{t.support} {kind} possible{outside}) {'FAIL' if law.failed(pos) else 'ok'}")
        if self.drafted is None:  # another server (vLLM, trtllm-serve) says nothing of its drafts
            out.append("sample  the server reports no draft figures: whether its acceptance rule was "
                       "exercised is not known")
        else:
            out.append(f"sample  the server drafted {self.drafted} tokens for these requests"
                       + ("" if self.drafted else ": its acceptance rule was NOT exercised"))
        return out


@dataclass(slots=True)
class Certificate:
    greedy: list[GreedyCheck] = field(default_factory=list)
    laws: list[SamplingCheck] = field(default_factory=list)  # sampled: plain, guided, processed, restricted
    coupled: list[GreedyCheck] = field(default_factory=list)  # seeded, Gumbel-coupled samples
    penalized: list[GreedyCheck] = field(default_factory=list)  # greedy under PENALIZED
    guided: list[GreedyCheck] = field(default_factory=list)  # greedy under GUIDED
    untested: list[str] = field(default_factory=list)  # what this certificate does not cover

    @property
    def passed(self) -> bool:
        return all(law.passed for law in self.laws) and all(g.passed for g in self.texts)

    @property
    def texts(self) -> list[GreedyCheck]:
        """Every served text held to the target alone's."""
        return self.greedy + self.coupled + self.penalized + self.guided

    def lines(self) -> list[str]:
        out = [line for check in self.texts for line in check.lines()]
        for law in self.laws:
            out += law.lines()
        out += [f"not tested: {what}" for what in self.untested]
        out.append("PASS: lossless" if self.passed else "FAIL: the deployment is not lossless")
        return out


def _first_difference(a, b) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def exact_joint(model, prompt: list[int], sampling: SamplingParams, steps: int,
                allowed: Callable[[list[int]], torch.Tensor] | None = None) -> dict[tuple[int, ...], float]:
    """Exact joint law of generated tokens 1..steps under the processed target distribution, walked
    over its top-k tree: each path of `steps` ids -> its probability. `allowed`: a guide's tokens
    after the generated ones (a [V] bool mask), applied before temperature, as the decoder does."""
    joint: dict[tuple[int, ...], float] = {}

    def walk(prefix: list[int], prob: float) -> None:
        if len(prefix) == steps:
            joint[tuple(prefix)] = prob
            return
        logits = model(torch.tensor([prompt + prefix])).logits[0, -1]  # [V]
        if allowed is not None:
            logits = logits.masked_fill(~allowed(prefix), float("-inf"))
        p = probs_from_logits(penalized(logits, sampling, prompt, prefix), sampling)
        for tok in torch.nonzero(p).flatten().tolist():
            walk(prefix + [tok], prob * p[tok].item())

    walk([], 1.0)
    return joint


def marginals(joint: dict[tuple[int, ...], float], steps: int) -> list[dict[int, float]]:
    """Each of the first `steps` positions' law, from their joint law."""
    laws: list[dict[int, float]] = [{} for _ in range(steps)]
    for ids, prob in joint.items():
        for pos, tok in enumerate(ids):
            laws[pos][tok] = laws[pos].get(tok, 0.0) + prob
    return laws


def exact_marginals(model, prompt: list[int], sampling: SamplingParams, steps: int,
                    allowed: Callable[[list[int]], torch.Tensor] | None = None) -> list[dict[int, float]]:
    """Exact law of generated tokens 1..steps under the processed target distribution (`exact_joint`)."""
    return marginals(exact_joint(model, prompt, sampling, steps, allowed), steps)


def text_law(joint: dict[tuple[int, ...], float], tokenizer, end_ids,
             prompt_ids: list[int] = ()) -> dict[str, float]:
    """The exact law of the text a server streams for a request of as many tokens as `joint`'s paths:
    the push-forward of their joint law through `streamed_text` (an end id ends the text, as it ends
    the request). A text is the same whichever split of it was sampled, so no text is re-tokenized."""
    law: dict[str, float] = {}
    for ids, prob in joint.items():
        text = streamed_text(tokenizer, list(ids), end_ids, prompt_ids)
        law[text] = law.get(text, 0.0) + prob
    return law


def tv_bound(support: int, n: int, delta: float) -> float:
    return math.sqrt((support * math.log(2) + math.log(1 / delta)) / (2 * n))


def check_samples(samples: int) -> None:
    """Refuse a sampling test too weak to fail or too long to end: `samples` must be 0 (none) or in
    [MIN_SAMPLES, MAX_SAMPLES]."""
    if samples > MAX_SAMPLES:
        raise ValueError(f"at most {MAX_SAMPLES:,} requests, got {samples:,} (2,000 already catch a law "
                         "moved by 0.05-0.1, docs/EVAL.md)")
    if 0 < samples < MIN_SAMPLES:
        raise ValueError(f"must be 0 (no sampling test) or at least {MIN_SAMPLES}, got {samples}: fewer "
                         "requests miss a law moved by 0.2 in total variation more often than not")


def entropy(law: dict[int, float]) -> float:
    return -sum(p * math.log(p) for p in law.values() if p > 0)


def sampling_prompt(model, tokenizer, prompts: list[str],
                    steps: int) -> tuple[str, dict[tuple[int, ...], float]]:
    """Of the first `SAMPLING_CANDIDATES` prompts, the one whose first `steps` generated tokens are
    least certain under the processed target (the largest summed entropy of their exact laws; the
    first of equals), and those tokens' exact joint law."""
    best: tuple[float, str, dict] | None = None
    for prompt in prompts[:SAMPLING_CANDIDATES]:
        joint = exact_joint(model, tokenizer.encode(prompt), SAMPLING, steps)
        spread = sum(entropy(law) for law in marginals(joint, steps))
        if best is None or spread > best[0]:
            best = (spread, prompt, joint)
    return best[1], best[2]


def _first_law(joint: dict[tuple[int, ...], float]) -> dict[int, float]:
    """The first generated token's law, from the joint law of the first ones."""
    return marginals(joint, len(next(iter(joint))))[0]


def barring_guide(joint: dict[tuple[int, ...], float], tokenizer) -> Guide | None:
    """A regex guide that bars the first character of the likeliest first token's text (of the
    tokens whose text has one), from the whole text: the guided law then differs from the plain one
    from the first token on. None: no first token has a character to bar."""
    firsts = _first_law(joint)
    for token in sorted(firsts, key=firsts.get, reverse=True):
        text = tokenizer.decode([token])
        if text and text[0] != "\ufffd":
            first = text[0]
            escaped = "\\" + first if first in "\\]^-[" else first  # a regex class's own characters
            char = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(first, escaped)
            return Guide("regex", "[^" + char + "]*")
    return None


def processed_sampling(joint: dict[tuple[int, ...], float]) -> SamplingParams:
    """SAMPLING with every other logits processor a server takes: PENALIZED's penalties, min-p
    `PROCESSED_MIN_P`, and a logit bias of `PROCESSED_BIAS` against the likeliest first token (so
    the law differs from the plain one from the first token on)."""
    firsts = _first_law(joint)
    penalties = PENALIZED.model_dump(include={"presence_penalty", "frequency_penalty", "repetition_penalty"})
    return SAMPLING.model_copy(update={**penalties, "min_p": PROCESSED_MIN_P,
                                       "logit_bias": ((max(firsts, key=firsts.get), PROCESSED_BIAS),)})


def _clean(tokenizer, ids: tuple[int, ...], word: bool = False) -> str | None:
    """The text of `ids` where it tokenizes back into them alone (a request's word or tag then
    stands for exactly these tokens), for a bad `word` with no leading whitespace (which a bad word
    loses); else None."""
    text = tokenizer.decode(list(ids))
    if not text or "\ufffd" in text or (word and text != text.lstrip()):
        return None
    return text if tuple(tokenizer.encode(text, add_special_tokens=False)) == ids else None


def restriction_of(joint: dict[tuple[int, ...], float], tokenizer, budget: bool = True) -> Restriction | None:
    """Bad words and a reasoning budget that move the law of tokens 2 and 3 on some paths and not
    on others: the likeliest first two tokens' text as a bad word (so token 2's law after the first
    changes), and with `budget` a block opened by the likeliest first token's text, holding `BUDGET`
    token before its default end (`</think>`) is forced (so token 3 is the end's first token on the
    paths that open the block, free on the rest). Only texts that tokenize back into their tokens;
    None: no such text."""
    pairs: dict[tuple[int, ...], float] = {}  # tokens 2 and 3: the word's first token is a draft
    for ids, prob in joint.items():
        pairs[ids[1:3]] = pairs.get(ids[1:3], 0.0) + prob
    likeliest = sorted(pairs, key=pairs.get, reverse=True)
    words = [text for pair in likeliest if (text := _clean(tokenizer, pair, word=True))]
    firsts = _first_law(joint)
    starts = [text for t in sorted(firsts, key=firsts.get, reverse=True) if (text := _clean(tokenizer, (t,)))]
    thinking = (BUDGET, starts[0], THINK_END) if budget and starts else None
    if not words and thinking is None:
        return None
    return Restriction(tuple(words[:1]), thinking)


def allowed_after(compiled, end_ids, vocab_size: int) -> Callable[[list[int]], torch.Tensor]:
    """`exact_joint`'s `allowed` for a compiled guide: the tokens it allows after a prefix."""
    def allowed(prefix: list[int]) -> torch.Tensor:
        state = GuideState(compiled, end_ids, vocab_size)
        state.extend(prefix)
        return state.allowed()

    return allowed


def _sample_served(url: str, model: str, prompt: str, n: int, api_key: str | None,
                   lengths: tuple[int, ...] = SAMPLE_TOKENS, sampling: SamplingParams = SAMPLING,
                   guide: Guide | None = None, restriction: Restriction | None = None) -> list[Completion]:
    """n seeded requests under `sampling` (and `guide`, `restriction`), seed i `lengths[i % len(lengths)]`
    tokens long."""
    params = [GenerateParams.of(sampling.model_copy(update={"seed": seed}), lengths[seed % len(lengths)])
              for seed in range(n)]
    if guide is not None:
        params = [dataclasses.replace(p, guide=(guide.kind, guide.text)) for p in params]
    if restriction is not None:
        params = [dataclasses.replace(p, bad_words=restriction.bad_words, thinking=restriction.thinking)
                  for p in params]
    scheme, address = split_url(url)
    if scheme == "grpc":
        return grpc_generate_many(address, model, [grpc_inputs(prompt, p) for p in params])
    with ThreadPoolExecutor(4) as pool:  # the server batches concurrent requests
        return list(pool.map(lambda p: generate(url, model, prompt, p, api_key=api_key), params))


def _drafted(completions: list[Completion]) -> int | None:
    """The draft tokens the server reports for `completions` (None: it reports none)."""
    drafted: int | None = 0
    for completion in completions:
        reported = completion.draft_tokens
        drafted = None if drafted is None or reported is None else drafted + reported
    return drafted


def streamed_text(tokenizer, ids: list[int], end_ids, prompt_ids: list[int] = ()) -> str:
    """The text a server streams for `ids` continuing `prompt_ids` (`TextStream`: trtspec's servers,
    and vLLM's incremental detokenizer alike): `decode(ids)` after the prompt's last ids, except
    where a byte-fallback decoder (SentencePiece's) turns a run of byte ids into U+FFFD whole once
    it holds an invalid sequence, where the text already sent for the run's first bytes stays.
    Compared with `decode(ids)`, a correct server's text differed there."""
    context = context_of(tokenizer.decode, prompt_ids)
    stream = TextStream(tokenizer.decode, end_ids=frozenset(end_ids), context=context)
    stream.push(ids)
    return stream.text


def answer_ids(tokenizer, prompt: str, prompt_ids: list[int], text: str) -> list[int]:
    """The ids a served answer's text stands for (an OpenAI server sends text): the prompt and the
    text tokenized together, past the prompt's ids (the text alone would gain a BOS, and lose a
    SentencePiece answer's first space); the text alone, without specials, where the two split
    otherwise at their seam."""
    whole = tokenizer.encode(prompt + text)
    if whole[: len(prompt_ids)] == prompt_ids:
        return whole[len(prompt_ids) :]
    return tokenizer.encode(text, add_special_tokens=False)


def law_of_texts(text_only: bool, tokenizer) -> bool:
    """Whether served samples are tested by the law of their whole texts: over text (openai://)
    with a tokenizer other than the byte-level one, whose texts can be tokenized into another split
    than the one sampled, which changes the tokens (and can show ones the target never samples) but
    not the text."""
    return text_only and not isinstance(tokenizer, ByteTokenizer)


def check_sampled(completions: list[Completion], joint: dict[tuple[int, ...], float], tokenizer, end_ids,
                  text_only: bool, alpha: float, prompt_ids: list[int] = ()) -> LawCheck:
    """Seeded sampled `completions` against the exact `joint` law of their first tokens: each
    token's law, or (`law_of_texts`) the law of the whole text of requests as many tokens long as
    `joint`'s paths."""
    steps = len(next(iter(joint)))
    if law_of_texts(text_only, tokenizer):
        counts: list[dict] = [{}]
        for completion in completions:
            counts[0][completion.text] = counts[0].get(completion.text, 0) + 1
        return check_law(counts, [text_law(joint, tokenizer, end_ids, prompt_ids)], alpha)
    counts = [{} for _ in range(steps)]
    for completion in completions:
        ids = tokenizer.encode(completion.text) if text_only else completion.token_ids
        for pos, tok in enumerate(ids[:steps]):
            counts[pos][tok] = counts[pos].get(tok, 0) + 1
    return check_law(counts, marginals(joint, steps), alpha)


def certify(url: str, model: str, config: BuildConfig, prompts: list[str], max_tokens: int = 48,
            samples: int = DEFAULT_SAMPLES, steps: int = STEPS, alpha: float = ALPHA,
            api_key: str | None = None) -> Certificate:
    """Run `prompts` through the server at `url` and through `config`'s target alone; `samples`:
    0 (no sampling test) or at least `MIN_SAMPLES`."""
    check_samples(samples)
    reference = load_pipeline(config, use_drafter=False)
    tokenizer = reference.tokenizer
    text_only = split_url(url)[0] == "openai"
    cert = Certificate()
    judge = GreedyJudge(config.target)  # the checkpoint in torch, loaded at the first difference
    unreadable = False  # a reference text holds U+FFFD, which text cannot tell apart

    def check(prompt: str, sampling: SamplingParams, guide: Guide | None = None) -> GreedyCheck:
        """The served text of `prompt` under `sampling` (and `guide`) against the target alone's,
        audited where they differ."""
        nonlocal unreadable
        params = GenerateParams.of(sampling, max_tokens)
        compiled = grammar = None
        if guide is not None:
            params = dataclasses.replace(params, guide=(guide.kind, guide.text))
            compiled = reference.guides.compile(guide)
            grammar = GuideState(compiled, reference.end_ids, reference.target.vocab_size)
        served = generate(url, model, prompt, params, api_key=api_key)
        prompt_ids = tokenizer.encode(prompt)
        expected = reference.decoder.generate(prompt_ids, max_tokens, sampling, guide=compiled).token_ids
        if text_only:
            text = streamed_text(tokenizer, expected, reference.end_ids, prompt_ids)
            unreadable |= "\ufffd" in text
            got, want = served.text, text
        else:
            got, want = served.token_ids, expected
        diff = _first_difference(got, want)
        result = GreedyCheck(prompt, diff is None, diff, served.tau, "character" if text_only else "token",
                             seed=None if sampling.greedy else sampling.seed, penalized=sampling.penalized,
                             guided=guide is not None)
        # ids only: a text leaves the end id's text out, so a near-tie at an end id reads as a prefix
        if not text_only and parted_by_length(got, want):
            result.lengths = (len(got), len(want))
        elif diff is not None:
            served_ids = answer_ids(tokenizer, prompt, prompt_ids, served.text) if text_only else \
                served.token_ids
            if served_ids:
                start = shared_prefix(served_ids, expected)  # the target alone's own tokens before
                result.audit = judge.audit(prompt_ids, served_ids, sampling, start, grammar)
        return result

    cert.greedy = [check(prompt, SamplingParams()) for prompt in prompts]
    if max_tokens == 1:
        cert.untested.append("speculation in the served texts (--max-tokens 1: each is its prompt's first "
                             "token, which the prefill gives and no draft precedes)")
    if config.sampling.coupling == "gumbel":
        cert.coupled = [check(prompt, SamplingParams(temperature=1.0, seed=COUPLED_SEED + i,
                                                     coupling="gumbel")) for i, prompt in enumerate(prompts)]
    try:
        cert.penalized = [check(prompt, PENALIZED) for prompt in prompts]
    except ClientError as exc:  # a server that refuses them (TensorRT-LLM's defaults-only inputs once)
        cert.untested.append(f"greedy texts under penalties: the server refused them ({exc})")
    try:
        cert.guided = [check(prompt, SamplingParams(), GUIDED) for prompt in prompts]
    except ClientError as exc:  # a server without guided decoding
        cert.untested.append(f"greedy texts under a guide: the server refused it ({exc})")
    if unreadable:
        cert.untested.append("which ids the served texts' U+FFFD characters stand for (an OpenAI server "
                             "sends text, and any invalid UTF-8 reads as U+FFFD)")
    if samples > 0:
        # the law is the checkpoint's, whatever the flavour served: torch is the reference
        torch_target = load_causal_lm(config.target.resolved_path, config.target.dtype)
        prompt, joint = sampling_prompt(torch_target, tokenizer, prompts, steps)
        by_text = law_of_texts(text_only, tokenizer)
        # a text's law is known for whole requests only: a longer one's does not tell where its
        # first `steps` tokens end
        lengths = (steps,) if by_text else SAMPLE_TOKENS
        def sampled(sampling: SamplingParams, guide: Guide | None = None,
                    exact: dict[tuple[int, ...], float] | None = None,
                    restriction: Restriction | None = None) -> SamplingCheck:
            """`samples` seeded requests of the prompt under `sampling` (and `guide`, `restriction`)
            against the exact law of the target alone under them."""
            if exact is None:
                allowed = None
                if guide is not None:
                    compiled = reference.guides.compile(guide)
                    allowed = allowed_after(compiled, reference.end_ids, reference.target.vocab_size)
                restricted = sampling if restriction is None else restriction.sampling(sampling, tokenizer)
                exact = exact_joint(torch_target, tokenizer.encode(prompt), restricted, steps, allowed)
            completions = _sample_served(url, model, prompt, samples, api_key, lengths, sampling, guide,
                                         restriction)
            law = check_sampled(completions, exact, tokenizer, reference.end_ids, text_only, alpha / LAWS,
                                tokenizer.encode(prompt))
            return SamplingCheck(prompt, samples, law, sampling, _drafted(completions),
                                 steps if by_text else None, guide, restriction)

        cert.laws.append(sampled(SAMPLING, exact=joint))
        # the same prompt under a guide that bars its likeliest first token: the masked law, drafted
        guide = barring_guide(joint, tokenizer)
        if guide is None:
            cert.untested.append("the sampled law under a guide (no first token has a character to bar)")
        else:
            try:
                cert.laws.append(sampled(SAMPLING, guide))
            except ClientError as exc:  # a server without regex guides (OpenAI's API has none)
                cert.untested.append(f"the sampled law under a guide ({exc})")
        # and under every other processor: penalties, min-p, a logit bias against that token
        try:
            cert.laws.append(sampled(processed_sampling(joint)))
        except ClientError as exc:
            cert.untested.append(f"the sampled law under penalties, min-p and logit_bias ({exc})")
        # and under a bad word and a reasoning budget, each acting on some paths and not others
        restriction = restriction_of(joint, tokenizer, budget=not text_only)
        if restriction is None:
            cert.untested.append("the sampled law under bad words and a reasoning budget (no first tokens' "
                                 "text tokenizes back into them)")
        else:
            try:
                cert.laws.append(sampled(SAMPLING, restriction=restriction))
            except ClientError as exc:  # a server without bad words or thinking_* inputs
                cert.untested.append(f"the sampled law under bad words and a reasoning budget ({exc})")
        if text_only:
            cert.untested.append("the sampled law under a reasoning budget: /v1/completions takes none "
                                 "(chat's thinking_token_budget needs the server's reasoning parser)")
        cert.untested.append(f"the sampled law past token {steps}, of other prompts, or at other "
                             "temperature, top-k, top-p, min-p, penalties, biases, bad words or budgets")
        if by_text:
            cert.untested.append(f"the law of drafts past the first: over openai:// with a BPE tokenizer "
                                 f"every sampled request is {steps} tokens long, so that its text's law is "
                                 "known exactly (grpc:// and http:// send ids and test 8-token requests too)")
    else:
        cert.untested.append("the sampled law (--samples 0)")
    if config.sampling.coupling != "gumbel":
        cert.untested.append("which text a seed gives: under rejection sampling it depends on the batch and "
                             "the schedule, so only the law is certified")
    return cert
