"""Sampling parameters and the logits → probabilities transform shared by p and q.

Speculative sampling is lossless for the *processed* target distribution: temperature, top-k
and top-p are applied to the target logits (p) and, identically, to the draft logits (q)
before the accept test, as vLLM and TensorRT-LLM do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    """Per-request decoding parameters. `temperature == 0` means greedy."""

    model_config = ConfigDict(frozen=True)

    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False,
                               description="0 = greedy; otherwise softmax temperature (finite)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus mass kept, in (0, 1]")
    top_k: int = Field(0, ge=0, description="keep the k most likely tokens; 0 = all")
    seed: int | None = Field(None, ge=0, le=2**64 - 1,
                             description="seed of the request's random generator (a UINT64, as Triton's "
                                         "random_seed)")
    coupling: Literal["rejection", "gumbel"] = Field(
        "rejection",
        description="how sampled drafts are verified: rejection = Leviathan et al.'s rule (the highest "
                    "acceptance; a seed repeats a text only under the same schedule); gumbel = every token "
                    "is argmax(log p + g(seed, position)) (`trtspec.spec.coupling`): the text is exactly "
                    "what the target alone samples with that seed, under any batch or schedule")

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


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k, top-p; return probabilities.  # logits: [..., V]

    Greedy requests get a one-hot distribution on the argmax, so greedy and sampling
    verification are the same rule on the same kind of input.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = scaled(logits, params.temperature)
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        # keep the smallest prefix whose mass reaches top_p; the most likely token always stays
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def scaled(logits: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """logits / T, shifted by each row's max first: the same distribution, and no overflow to ±inf
    (then NaN probabilities) however small T is (1e-45, a positive float32, is a valid request);
    the max logit becomes 0, the rest are <= 0.  logits [..., V]; T a float or [..., 1]."""
    return (logits - logits.amax(-1, keepdim=True)) / temperature


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw per row.  # probs: [..., V] -> [...]"""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


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
    return (params.temperature, params.top_p, params.top_k)


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
