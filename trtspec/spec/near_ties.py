"""Greedy losslessness at reduced precision: every emitted token is the target's argmax, up to rounding.

In float32 speculative greedy decoding reproduces the target alone token for token. In bfloat16 or
float16 it need not: the verify forward over k + 1 tokens and the one-token forward of plain
decoding sum in different orders, their logits differ by an ulp or two, and where the target's two
best tokens are that close the two decodings can pick different ones and then continue apart. Both
are greedy decodings of the same model, up to its rounding.

`audit_greedy` makes that claim checkable instead of waived. It feeds the target the prompt and a
decoded continuation twice, in one forward and in chunks of a verify step's size, and takes

- noise: the largest difference between the two passes' logits, the model's own rounding at this
  dtype on this very sequence (the tiny target: about 1e-5 in float32, 0.12-0.19 in bfloat16), and
- each emitted token's gap: the one-forward pass's best logit minus the emitted token's.

The continuation is greedy up to rounding when every gap is at most `TIE_FACTOR` × noise. A wrong
token (a verifier bug, another model) sits far off the argmax, so it fails even in bfloat16.

Gumbel-coupled sampling (`trtspec.spec.coupling`) is greedy decoding of the scores
log p(v) + g(seed, position, v), so the same audit holds a coupled text to them: the gap is taken
over those scores, and the noise is the logits' over the temperature (the scale they enter at).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trtspec.models.target import Chunk, TargetModel
from trtspec.spec.coupling import coupled_scores
from trtspec.spec.penalties import Penalties

if TYPE_CHECKING:
    from trtspec.config import TargetConfig
    from trtspec.spec.grammar import GuideState
    from trtspec.spec.sampling import SamplingParams

IDENTICAL, NEAR_TIE, MISMATCH = "identical", "near-tie", "mismatch"  # GreedyJudge's verdicts
TIE_FACTOR = 2.0  # a gap within this many times the measured rounding noise is a near-tie
CHUNK = 16  # the second pass's chunk: a verify step's size (DFlash block 16)


@dataclass(slots=True)
class GreedyAudit:
    tokens: int  # emitted tokens audited
    off_argmax: list[int]  # positions (0 = first emitted token) whose token is not the strict argmax
    gaps: list[float]  # best logit − emitted token's logit at each of those positions
    noise: float  # max |logits of one forward − logits in chunks| over the sequence (/ T: coupled)
    dtype: str
    choice: str = "argmax"  # what each token should be: the target's "argmax" or "coupled sample"

    @property
    def tolerance(self) -> float:
        return TIE_FACTOR * self.noise

    @property
    def near_ties_only(self) -> bool:
        """Every emitted token is the argmax up to the model's rounding."""
        return all(g <= self.tolerance for g in self.gaps)

    @property
    def first_wrong(self) -> int | None:
        """The first position whose token is off the argmax by more than rounding."""
        return next((p for p, g in zip(self.off_argmax, self.gaps, strict=True) if g > self.tolerance), None)

    def describe(self) -> str:
        if not self.off_argmax:
            return f"every one of {self.tokens} tokens is the target's {self.choice}"
        worst = max(self.gaps)
        if self.near_ties_only:
            return (f"{len(self.off_argmax)} of {self.tokens} tokens at near-ties (largest gap "
                    f"{worst:.3g} ≤ {TIE_FACTOR:g} × {self.dtype} rounding noise {self.noise:.3g}): "
                    f"the target's {self.choice} up to rounding")
        p = self.first_wrong
        return (f"token {p} is off the target's {self.choice} by {self.gaps[self.off_argmax.index(p)]:.3g}, "
                f"more than {TIE_FACTOR:g} × {self.dtype} rounding noise {self.noise:.3g}")


def _scores(logits: torch.Tensor, sampling: SamplingParams | None, first: int) -> torch.Tensor:
    """What a decoding takes the argmax of: the logits (greedy), or log p + g at the positions
    first, first + 1, … (Gumbel-coupled).  logits [n, V] -> [n, V] float32"""
    if sampling is None or not sampling.gumbel:
        return logits.float()
    return coupled_scores(logits[None], [sampling], [list(range(first, first + logits.shape[0]))])[0]


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` have in common."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def parted_by_length(a, b) -> bool:
    """`a` and `b` differ only in where they end (one is a strict prefix of the other): no token
    choice parts them, so no near-tie can explain it (an output cut short, or run past an end id or
    max_tokens). Token lists, or texts."""
    return len(a) != len(b) and a[: min(len(a), len(b))] == b[: min(len(a), len(b))]


@torch.inference_mode()
def audit_greedy(target: TargetModel, prompt_ids: list[int], output_ids: list[int],
                 chunk: int = CHUNK, sampling: SamplingParams | None = None, start: int = 0,
                 grammar: GuideState | None = None) -> GreedyAudit:
    """Is every token of `output_ids` the target's argmax after `prompt_ids` and the tokens before
    it — or, for a Gumbel-coupled `sampling`, its coupled sample — up to the target's rounding?
    (See the module docstring.) `start`: the tokens before it are the reference decoding's own (the
    target alone's), which are its choices by definition and are not judged: plain decoding's one-token
    steps round apart from one forward by more than the chunked pass measures at times, and its own
    near-ties there failed a bfloat16 text that parted from it only at a later near-tie. `grammar`: the
    request's guide at the prompt (`spec.grammar`), whose mask each position's choice was made under."""
    if not prompt_ids or not output_ids:
        raise ValueError("audit_greedy needs a non-empty prompt and output")
    seq = torch.tensor(prompt_ids + output_ids[:-1], device=target.device)  # [T]
    first = len(prompt_ids) - 1  # the position whose logits choose output_ids[0]
    target.allocate(1, len(seq))
    one = target.forward([Chunk(0, seq)]).logits[first:]  # [n, V]
    target.allocate(1, len(seq))
    parts = [target.forward([Chunk(0, seq[: first + 1])]).logits[-1:]]
    for at in range(first + 1, len(seq), chunk):
        parts.append(target.forward([Chunk(0, seq[at:at + chunk])]).logits)
    chunked = torch.cat(parts)  # [n, V]
    noise = (one - chunked).abs().max().item()
    if sampling is not None and sampling.penalized:  # the law the request asked for (`spec.penalties`)
        r = sampling.repetition_penalty
        noise *= max(r, 1 / r)  # a logit divided or multiplied by r moves its rounding by as much
        one = one.float().clone()
        history = torch.tensor(output_ids[:-1], dtype=torch.long, device=one.device)
        Penalties(sampling, prompt_ids, one.shape[-1], one.device).apply(one, history)
    if grammar is not None:  # a token the guide refuses where it stands is never the argmax
        one = one.float().clone()
        grammar.mask(one, torch.tensor(output_ids[:-1], dtype=torch.long))
    if sampling is not None and sampling.gumbel:
        noise /= sampling.temperature
    scores = _scores(one, sampling, len(prompt_ids))  # [n, V]; output_ids[j] sits at P + j
    emitted = torch.tensor(output_ids, device=one.device)
    gap = scores.max(-1).values - scores.gather(1, emitted[:, None])[:, 0]  # [n] ≥ 0 (inf: cut by top-k/p)
    gap[:start] = 0.0  # the reference's own tokens
    off = torch.nonzero(gap > 0).flatten().tolist()
    dtype = str(target.model.dtype).removeprefix("torch.")
    choice = "coupled sample" if sampling is not None and sampling.gumbel else "argmax"
    return GreedyAudit(len(output_ids), off, gap[off].tolist(), noise, dtype, choice)


class GreedyJudge:
    """Sorts greedy (or Gumbel-coupled) outputs against the reference decoding of the same prompt:
    IDENTICAL, NEAR_TIE (they part, and every token of the output is the target's argmax — coupled
    sample — up to rounding) or MISMATCH. The auditing target is made at the first difference: over
    the same weights when `target` is a torch `TargetModel`, else (an engine) the checkpoint in the
    config's dtype."""

    def __init__(self, config: TargetConfig, target=None):
        self.config, self.target = config, target
        self._auditor: TargetModel | None = None

    def audit(self, prompt_ids: list[int], output_ids: list[int],
              sampling: SamplingParams | None = None, start: int = 0,
              grammar: GuideState | None = None) -> GreedyAudit:
        if self._auditor is None:
            if isinstance(self.target, TargetModel):  # its own K/V buffers, the same weights
                self._auditor = TargetModel(self.target.model)
            else:
                self._auditor = TargetModel.from_pretrained(self.config.resolved_path, self.config.dtype,
                                                            device=self.config.device)
        return audit_greedy(self._auditor, prompt_ids, output_ids, sampling=sampling, start=start,
                            grammar=grammar)

    def __call__(self, prompt_ids: list[int], output_ids: list[int], reference_ids: list[int],
                 sampling: SamplingParams | None = None) -> str:
        if output_ids == reference_ids:
            return IDENTICAL
        if not output_ids or parted_by_length(output_ids, reference_ids):
            return MISMATCH
        audit = self.audit(prompt_ids, output_ids, sampling, shared_prefix(output_ids, reference_ids))
        return NEAR_TIE if audit.near_ties_only else MISMATCH
