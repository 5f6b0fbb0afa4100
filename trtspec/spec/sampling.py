"""Sampling parameters and the logits → probabilities transform shared by p and q.

Speculative sampling is lossless for the *processed* target distribution: temperature, top-k
and top-p are applied to the target logits (p) and, identically, to the draft logits (q)
before the accept test, as vLLM and TensorRT-LLM do. Logit bias, the repetition, frequency and
presence penalties, bad words and a reasoning budget depend on the tokens before each position; the
decoder applies them to p first (`trtspec.spec.penalties`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from trtspec.spec.thinking_budget import ThinkingBudget

MAX_LOGIT_BIAS = 100.0  # OpenAI's bound on a logit_bias value
MAX_PENALTY = 2.0  # OpenAI's bound on presence_penalty and frequency_penalty


class SamplingParams(BaseModel):
    """Per-request decoding parameters. `temperature == 0` means greedy."""

    model_config = ConfigDict(frozen=True)

    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False,
                               description="0 = greedy; otherwise softmax temperature (finite)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus mass kept, in (0, 1]")
    top_k: int = Field(0, ge=0, description="keep the k most likely tokens; 0 = all")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="drop the tokens less likely than min_p times the "
                                                          "most likely one (vLLM's min_p); 0 = off")
    seed: int | None = Field(None, ge=0, le=2**64 - 1,
                             description="seed of the request's random generator (a UINT64, as Triton's "
                                         "random_seed)")
    coupling: Literal["rejection", "gumbel"] = Field(
        "rejection",
        description="how sampled drafts are verified: rejection = Leviathan et al.'s rule (the highest "
                    "acceptance; a seed repeats a text only under the same schedule); gumbel = every token "
                    "is argmax(log p + g(seed, position)) (`trtspec.spec.coupling`): the text is exactly "
                    "what the target alone samples with that seed, under any batch or schedule")
    presence_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY,
                                    description="subtracted from the logit of every token generated so far "
                                                "(OpenAI's presence_penalty)")
    frequency_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY,
                                     description="times the count of each token generated so far, subtracted "
                                                 "from its logit (OpenAI's frequency_penalty)")
    repetition_penalty: float = Field(1.0, gt=0.0, allow_inf_nan=False,
                                      description="the logit of each token of the prompt or output "
                                                  "divided by it where positive, multiplied where negative "
                                                  "(CTRL's, as in transformers and vLLM); 1 = off")
    logit_bias: tuple[tuple[int, float], ...] = Field(
        (), description=f"(token id, bias) pairs added to the logits, bias in [-{MAX_LOGIT_BIAS:g}, "
                        f"{MAX_LOGIT_BIAS:g}] (OpenAI's logit_bias)")

    bad_words: tuple[tuple[int, ...], ...] = Field(
        (), description="token sequences that may not be generated: a sequence's last token is banned "
                        "wherever the generated tokens end with the ones before it (vLLM's and "
                        "TensorRT-LLM's bad_words, tokenized)")

    thinking: ThinkingBudget | None = Field(
        None, description="a reasoning budget: the end of the model's thinking block forced once it holds "
                          "this many tokens (TensorRT-LLM's thinking_token_budget; `spec.thinking_budget`)")

    @field_validator("bad_words")
    @classmethod
    def _bad_sequences(cls, words: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        for word in words:
            if not word:
                raise ValueError("a bad word holds no token")
            if min(word) < 0:
                raise ValueError(f"bad word {list(word)} holds a negative token id")
        return words

    @field_validator("logit_bias")
    @classmethod
    def _bias_pairs(cls, pairs: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
        seen = set()
        for token, bias in pairs:
            if token < 0:
                raise ValueError(f"token id {token} is negative")
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:  # NaN fails too
                raise ValueError(f"bias {bias} of token {token} is outside "
                                 f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]")
            if token in seen:
                raise ValueError(f"token {token} is given twice")
            seen.add(token)
        return pairs

    @property
    def penalized(self) -> bool:
        """The request changes the target's logits by what came before (`spec.penalties`)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.bad_words or self.thinking)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def gumbel(self) -> bool:
        """A sampled request whose tokens are fixed by its seed and their positions."""
        return self.coupling == "gumbel" and not self.greedy

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        gen = torch.Generator(device=device)
        if self.seed is None:
            gen.seed()
        else:
            gen.manual_seed(self.seed)
        return gen


def tempered(logits: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """logits / T up to a constant per row, as (logits − max) / T: softmax is shift-invariant, so the
    law is the same, and no T > 0 overflows (30 / 1e-40 is inf, and softmax of infs is NaN): as T → 0
    every token but the most likely goes to −inf, the greedy limit.  A T under float32's smallest
    normal (1e-300, 5e-324: Python floats the API lets through) divides as that smallest normal: in
    float32 it rounded to 0, and 0 / 0 made the most likely token NaN.  logits [..., V]; temperature
    a number or broadcastable to logits [..., 1] -> float32 [..., V]"""
    logits = logits.float()
    tiny = torch.finfo(torch.float32).tiny
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.float().clamp(min=tiny)
    else:
        temperature = max(temperature, tiny)
    top = logits.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0.0)  # a row of −inf (or inf) stays what it was
    return (logits - top) / temperature


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k, min-p, top-p (vLLM's order); return probabilities.  # logits: [..., V]

    Greedy requests get a one-hot distribution on the argmax, so greedy and sampling
    verification are the same rule on the same kind of input.
    """
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = tempered(logits, params.temperature)
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.min_p > 0.0:  # the most likely token always stays
        probs = probs.masked_fill(probs < params.min_p * probs.amax(-1, keepdim=True), 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        # keep the smallest prefix whose mass reaches top_p; the most likely token always stays
        drop_sorted = mass_before >= params.top_p
        drop_sorted[..., 0] = False  # a top_p under float32's smallest (5e-324) compares as 0: drop all
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def row_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Each row under its own parameters.  logits [R, ..., V] -> probs [R, ..., V]; rows that share
    temperature/top-k/top-p are processed together."""
    if len(set(_key(p) for p in params)) == 1:
        return probs_from_logits(logits, params[0])
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    groups: dict[tuple, list[int]] = {}
    for r, p in enumerate(params):
        groups.setdefault(_key(p), []).append(r)
    for rows in groups.values():
        idx = torch.tensor(rows, device=logits.device)
        out[idx] = probs_from_logits(logits[idx], params[rows[0]])
    return out


def _key(params: SamplingParams) -> tuple:
    return (params.temperature, params.top_p, params.top_k, params.min_p)


def choose_tokens(logits: torch.Tensor, params: Sequence[SamplingParams],
                  generators: Sequence[torch.Generator],
                  positions: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pick a token per row (and slot): argmax for greedy rows, the coupled sample at the slot's
    position for Gumbel-coupled rows (`spec.coupling`), otherwise a draw from the processed
    distribution q, each slot independently, from the row's own generator. logits [R, V] or
    [R, n, V] (a DFlash block), positions [R]: row r's first slot's (slot j at positions[r] + j)
    -> tokens [R] or [R, n], q like logits (None when every row is greedy; a greedy row's q is
    one-hot on its argmax)."""
    from trtspec.spec.coupling import coupled_choice, coupled_rows

    block = logits if logits.dim() == 3 else logits[:, None]  # [R, n, V]
    tokens = block.argmax(-1)  # [R, n]
    coupled = coupled_rows(params)
    if coupled:
        if positions is None:
            raise ValueError("Gumbel-coupled rows need the positions of the tokens they choose")
        idx = torch.tensor(coupled, device=logits.device)
        at = [[positions[r] + j for j in range(block.shape[1])] for r in coupled]  # [C, n]
        tokens[idx] = coupled_choice(block[idx], [params[r] for r in coupled], at)
    q = None
    if not all(p.greedy for p in params):
        q = row_probs(block, params)  # [R, n, V]
        for r, p in enumerate(params):
            if not p.greedy and not p.gumbel:
                tokens[r] = torch.multinomial(q[r], 1, generator=generators[r])[:, 0]  # [n]
    if logits.dim() == 2:
        return tokens[:, 0], None if q is None else q[:, 0]
    return tokens, q
