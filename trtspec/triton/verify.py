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
   a prompt whose tokens are near-certain passes any server), n requests with seeds 0..n-1 at
   temperature 1, top-k 3, each
   `SAMPLE_TOKENS` long so that the first tokens pass through the verifier's acceptance rule (a
   request of `steps` tokens would leave no room to draft); the empirical law of each of the
   first `steps` tokens is compared with the exact marginal law of the processed target
   distribution, computed by walking the target's top-k tree with the checkpoint loaded in torch
   (whatever the flavour served, so an engine deployment is held to the model it was exported
   from). A position fails when the total-variation distance exceeds the Bretagnolle–Huber–Carol
   bound sqrt((K ln 2 + ln(1/δ)) / 2n) (K = support size), so a correct server fails with
   probability < δ per position whatever n is. n must be at least `MIN_SAMPLES`: with fewer draws the
   bound at the largest possible support (3 ** steps tokens) exceeds `MAX_BOUND`, a test too weak
   to fail. Choosing the prompt walks the exact laws of the first `SAMPLING_CANDIDATES` given.
   OpenAI servers' texts are tokenized with the
   reference's tokenizer (exact for the byte-level models; for a BPE tokenizer a sampled text can
   split differently from how it was generated, which can only add distance).
3. Seeded samples, for a deployment that samples with Gumbel coupling (`sampling.coupling:
   gumbel` in the config): every prompt once more at temperature 1, seed COUPLED_SEED + i; the
   served sample must equal, token for token (character for character over OpenAI), what the
   target alone samples with that seed (`trtspec.spec.coupling`): the greedy check, for sampling,
   audited the same way where they differ (a coupled sample is the argmax of log p + g).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from trtspec.config import BuildConfig
from trtspec.models.target import load_causal_lm
from trtspec.pipeline import load_pipeline
from trtspec.spec.near_ties import GreedyAudit, GreedyJudge, shared_prefix
from trtspec.spec.sampling import SamplingParams, probs_from_logits
from trtspec.triton.client import (
    Completion,
    GenerateParams,
    generate,
    grpc_generate_many,
    grpc_inputs,
    split_url,
)
from trtspec.triton.request import TextStream

DEFAULT_PROMPTS = (
    "Q: 482 + 356\nA:",
    "Q: 34 * 8\nA:",
    "def parse(self, text):\n",
    "import os\n",
    "Explain what a generator is and when to use one.",
)
SAMPLING = SamplingParams(temperature=1.0, top_k=3)
SAMPLE_TOKENS = 8  # per sampling request: the first cycle drafts up to 6 tokens before position 3
STEPS = 3  # generated tokens whose law the sampling test compares
DELTA = 1e-3  # probability that a correct server fails a position
MAX_BOUND = 0.5  # the weakest TV bound the sampling test accepts to run with
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

    @property
    def passed(self) -> bool:
        return self.identical or (self.audit is not None and self.audit.near_ties_only)

    def lines(self) -> list[str]:
        if self.identical:
            verdict = "identical"
        else:
            verdict = f"{'differs' if self.passed else 'MISMATCH'} at {self.unit} {self.first_difference}"
        kind, seed = ("greedy ", "") if self.seed is None else ("sampled", f"  seed {self.seed}")
        tau = "–" if self.served_tau is None else f"{self.served_tau:.2f}"
        out = [f"{kind} {verdict:<24} tau={tau}{seed}  {self.prompt[:40]!r}"]
        if self.audit is not None:
            out.append(f"        served tokens: {self.audit.describe()}")
        return out


@dataclass(slots=True)
class SamplingCheck:
    prompt: str
    samples: int
    tv: list[float]  # per position
    bound: list[float]

    @property
    def passed(self) -> bool:
        return all(t <= b for t, b in zip(self.tv, self.bound, strict=True))


@dataclass(slots=True)
class Certificate:
    greedy: list[GreedyCheck] = field(default_factory=list)
    sampling: SamplingCheck | None = None
    coupled: list[GreedyCheck] = field(default_factory=list)  # seeded, Gumbel-coupled samples

    @property
    def passed(self) -> bool:
        sampling_ok = self.sampling is None or self.sampling.passed
        return sampling_ok and all(g.passed for g in self.greedy + self.coupled)

    def lines(self) -> list[str]:
        out = [line for check in self.greedy + self.coupled for line in check.lines()]
        if self.sampling is not None:
            s = self.sampling
            out.append(f"sample  law of the first {len(s.tv)} tokens of {s.prompt[:40]!r} (the prompt "
                       "they are least certain after)")
            for pos, (tv, bound) in enumerate(zip(s.tv, s.bound, strict=True)):
                verdict = "ok" if tv <= bound else "FAIL"
                out.append(
                    f"sample  token {pos + 1}: TV {tv:.4f} (bound {bound:.4f}, {s.samples} draws) {verdict}"
                )
        out.append("PASS: lossless" if self.passed else "FAIL: the deployment is not lossless")
        return out


def _first_difference(a, b) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def exact_marginals(model, prompt: list[int], sampling: SamplingParams, steps: int) -> list[dict[int, float]]:
    """Exact law of generated tokens 1..steps under the processed target distribution."""
    laws: list[dict[int, float]] = [{} for _ in range(steps)]

    def walk(prefix: list[int], prob: float, depth: int) -> None:
        if depth == steps:
            return
        logits = model(torch.tensor([prompt + prefix])).logits[0, -1]  # [V]
        p = probs_from_logits(logits, sampling)
        for tok in torch.nonzero(p).flatten().tolist():
            laws[depth][tok] = laws[depth].get(tok, 0.0) + prob * p[tok].item()
            walk(prefix + [tok], prob * p[tok].item(), depth + 1)

    walk([], 1.0, 0)
    return laws


def tv_bound(support: int, n: int, delta: float) -> float:
    return math.sqrt((support * math.log(2) + math.log(1 / delta)) / (2 * n))


def min_samples(steps: int = STEPS, delta: float = DELTA, max_bound: float = MAX_BOUND) -> int:
    """The fewest draws whose TV bound is at most `max_bound` at every position, whatever the law:
    position `steps` can take top_k ** steps tokens."""
    support = SAMPLING.top_k ** steps
    return math.ceil((support * math.log(2) + math.log(1 / delta)) / (2 * max_bound**2))


MIN_SAMPLES = min_samples()


def check_samples(samples: int, steps: int = STEPS, delta: float = DELTA) -> None:
    """Refuse a sampling test too weak to fail: `samples` must be 0 (none) or `min_samples`."""
    least = min_samples(steps, delta)
    if 0 < samples < least:
        raise ValueError(f"must be 0 (no sampling test) or at least {least}, got {samples}: fewer draws "
                         f"leave a TV bound over {MAX_BOUND}, a test too weak to fail")


def entropy(law: dict[int, float]) -> float:
    return -sum(p * math.log(p) for p in law.values() if p > 0)


def sampling_prompt(model, tokenizer, prompts: list[str], steps: int) -> tuple[str, list[dict[int, float]]]:
    """Of the first `SAMPLING_CANDIDATES` prompts, the one whose first `steps` generated tokens are
    least certain under the processed target (the largest summed entropy of their exact laws; the
    first of equals), and those laws."""
    best: tuple[float, str, list] | None = None
    for prompt in prompts[:SAMPLING_CANDIDATES]:
        laws = exact_marginals(model, tokenizer.encode(prompt), SAMPLING, steps)
        spread = sum(entropy(law) for law in laws)
        if best is None or spread > best[0]:
            best = (spread, prompt, laws)
    return best[1], best[2]


def _sample_served(url: str, model: str, prompt: str, n: int, api_key: str | None) -> list[Completion]:
    params = [GenerateParams(max_tokens=SAMPLE_TOKENS, temperature=SAMPLING.temperature,
                             top_k=SAMPLING.top_k, seed=seed) for seed in range(n)]
    scheme, address = split_url(url)
    if scheme == "grpc":
        return grpc_generate_many(address, model, [grpc_inputs(prompt, p) for p in params])
    with ThreadPoolExecutor(4) as pool:  # the server batches concurrent requests
        return list(pool.map(lambda p: generate(url, model, prompt, p, api_key=api_key), params))


def streamed_text(tokenizer, ids: list[int], end_ids) -> str:
    """The text a server streams for `ids` (`TextStream`: trtspec's servers, and vLLM's incremental
    detokenizer alike): `decode(ids)`, except where a byte-fallback decoder (SentencePiece's) turns
    a run of byte ids into U+FFFD whole once it holds an invalid sequence, where the text already
    sent for the run's first bytes stays. Compared with `decode(ids)`, a correct server's text
    differed there."""
    stream = TextStream(tokenizer.decode, end_ids=frozenset(end_ids))
    stream.push(ids)
    return stream.text


def certify(url: str, model: str, config: BuildConfig, prompts: list[str], max_tokens: int = 48,
            samples: int = 400, steps: int = STEPS, delta: float = DELTA,
            api_key: str | None = None) -> Certificate:
    """Run `prompts` through the server at `url` and through `config`'s target alone; `samples`:
    0 (no sampling test) or at least `min_samples(steps, delta)`."""
    check_samples(samples, steps, delta)
    reference = load_pipeline(config, use_drafter=False)
    tokenizer = reference.tokenizer
    text_only = split_url(url)[0] == "openai"
    cert = Certificate()
    judge = GreedyJudge(config.target)  # the checkpoint in torch, loaded at the first difference

    def check(prompt: str, sampling: SamplingParams) -> GreedyCheck:
        """The served text of `prompt` under `sampling` against the target alone's, audited where
        they differ."""
        served = generate(url, model, prompt, GenerateParams.of(sampling, max_tokens), api_key=api_key)
        prompt_ids = tokenizer.encode(prompt)
        expected = reference.decoder.generate(prompt_ids, max_tokens, sampling).token_ids
        if text_only:
            diff = _first_difference(served.text, streamed_text(tokenizer, expected, reference.end_ids))
        else:
            diff = _first_difference(served.token_ids, expected)
        result = GreedyCheck(prompt, diff is None, diff, served.tau, "character" if text_only else "token",
                             seed=None if sampling.greedy else sampling.seed)
        if diff is not None:
            served_ids = tokenizer.encode(served.text) if text_only else served.token_ids
            if served_ids:
                start = shared_prefix(served_ids, expected)  # the target alone's own tokens before
                result.audit = judge.audit(prompt_ids, served_ids, sampling, start)
        return result

    cert.greedy = [check(prompt, SamplingParams()) for prompt in prompts]
    if config.sampling.coupling == "gumbel":
        cert.coupled = [check(prompt, SamplingParams(temperature=1.0, seed=COUPLED_SEED + i,
                                                     coupling="gumbel")) for i, prompt in enumerate(prompts)]
    if samples > 0:
        # the law is the checkpoint's, whatever the flavour served: torch is the reference
        torch_target = load_causal_lm(config.target.resolved_path, config.target.dtype)
        prompt, laws = sampling_prompt(torch_target, tokenizer, prompts, steps)
        counts: list[dict[int, int]] = [{} for _ in range(steps)]
        for completion in _sample_served(url, model, prompt, samples, api_key):
            ids = tokenizer.encode(completion.text) if text_only else completion.token_ids
            for pos, tok in enumerate(ids[:steps]):
                counts[pos][tok] = counts[pos].get(tok, 0) + 1
        tvs, bounds = [], []
        for pos in range(steps):
            support = set(laws[pos]) | set(counts[pos])
            drawn = max(1, sum(counts[pos].values()))
            tvs.append(0.5 * sum(abs(counts[pos].get(t, 0) / drawn - laws[pos].get(t, 0.0)) for t in support))
            bounds.append(tv_bound(len(support), drawn, delta))
        cert.sampling = SamplingCheck(prompt, samples, tvs, bounds)
    return cert
