"""The verifier: one rule that decides which draft tokens the target keeps.

Vocabulary (as in vLLM's rejection sampler), for a draft block x_1..x_k with draft
distributions q_i and target distributions p_1..p_{k+1} from ONE target forward:
- accepted: the longest prefix x_1..x_a that passes the test below;
- recovered: when x_{a+1} is rejected, a token drawn from norm(max(0, p_{a+1} − q_{a+1}));
- bonus: when all k drafts are accepted, a token drawn from p_{k+1}.
Every cycle emits a + 1 tokens: the accepted ones plus one recovered or bonus token.

Greedy (temperature 0): x_i is accepted iff x_i == argmax p_i; the extra token is argmax p_{a+1}.
Sampling (Leviathan et al. 2023, Chen et al. 2023): x_i is accepted with probability
min(1, p_i(x_i) / q_i(x_i)); the emitted sequence is then distributed exactly as the target's.

`Verifier.verify` decides a whole step at once: every running request is a row, with its own
number of drafts to consider (`draft_lens`, ragged), its own sampling parameters (greedy and
sampling rows in the same step) and its own random generator; Gumbel-coupled rows
(`trtspec.spec.coupling`) take the greedy rule with the target's coupled samples for its argmax.
`Verifier.verify_tree` does the same for draft trees (the rules: `trtspec.spec.tree_verify`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import torch

from trtspec.spec.coupling import coupled_choice, coupled_rows
from trtspec.spec.sampling import SamplingParams, row_probs

if TYPE_CHECKING:
    from trtspec.spec.tree import DraftTree
    from trtspec.spec.tree_verify import TreeVerdict

PAD = -1
Verdict = TypeVar("Verdict")  # a chain's VerifyOutput or a tree's TreeVerdict


@dataclass(slots=True)
class VerifyOutput:
    num_accepted: torch.Tensor  # [b] accepted draft tokens per row, in [0, k]
    tokens: torch.Tensor  # [b, k+1] accepted tokens then the recovered/bonus token, PAD after

    def row(self, r: int) -> list[int]:
        return self.tokens[r, : int(self.num_accepted[r]) + 1].tolist()


def _draft_valid(draft_tokens: torch.Tensor, draft_lens: torch.Tensor | None) -> torch.Tensor:
    b, k = draft_tokens.shape
    positions = torch.arange(k, device=draft_tokens.device).expand(b, k)
    if draft_lens is None:
        return torch.ones(b, k, dtype=torch.bool, device=draft_tokens.device)
    return positions < draft_lens[:, None]


def _assemble(draft_tokens: torch.Tensor, num_accepted: torch.Tensor, last: torch.Tensor) -> VerifyOutput:
    b, k = draft_tokens.shape
    tokens = torch.full((b, k + 1), PAD, dtype=torch.long, device=draft_tokens.device)
    keep = torch.arange(k, device=draft_tokens.device)[None, :] < num_accepted[:, None]
    tokens[:, :k] = torch.where(keep, draft_tokens, PAD)
    tokens.scatter_(1, num_accepted[:, None], last[:, None])
    return VerifyOutput(num_accepted=num_accepted, tokens=tokens)


def verify_greedy(
    draft_tokens: torch.Tensor,  # [b, k]
    target_logits: torch.Tensor,  # [b, k+1, V]
    draft_lens: torch.Tensor | None = None,  # [b] drafts to consider per row (<= k); None = all
) -> VerifyOutput:
    """Accept the longest prefix equal to the target's argmax, then emit argmax p_{a+1}."""
    return verify_chosen(draft_tokens, target_logits.argmax(-1), draft_lens)


def verify_chosen(
    draft_tokens: torch.Tensor,  # [b, k]
    target_choice: torch.Tensor,  # [b, k+1] the token the target picks at each position
    draft_lens: torch.Tensor | None = None,  # [b] drafts to consider per row (<= k); None = all
) -> VerifyOutput:
    """The greedy rule with the target's picks given: accept the longest prefix equal to them, then
    emit the target's pick after it (greedy: its argmax; Gumbel coupling: its coupled sample)."""
    k = draft_tokens.shape[1]
    match = (draft_tokens == target_choice[:, :k]) & _draft_valid(draft_tokens, draft_lens)
    num_accepted = match.long().cumprod(-1).sum(-1)  # [b]
    last = target_choice.gather(1, num_accepted[:, None]).squeeze(1)
    return _assemble(draft_tokens, num_accepted, last)


def draw_uniforms(b: int, k: int, generator: torch.Generator,
                  device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The randomness of one sampling verdict: (uniforms [b, k] for the accept tests, u_last [b]
    for the recovered/bonus token), drawn in that order from `generator`."""
    device = device or generator.device
    uniforms = torch.rand(b, k, generator=generator, device=device)
    return uniforms, torch.rand(b, generator=generator, device=device)


def inverse_cdf(dist: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """dist [b, V] unnormalised, u [b] in [0, 1) -> [b] first j with cdf_j > u·total (float64).

    Zero-probability tokens are never chosen; if rounding leaves u·total at or past the end, the
    last token with positive probability is."""
    cdf = dist.double().cumsum(-1)  # [b, V]
    target = u.double() * cdf[:, -1]
    hit = cdf > target[:, None]
    first = torch.where(hit.any(-1), hit.long().argmax(-1), -1)
    positive = torch.arange(dist.shape[-1], device=dist.device).expand_as(dist).masked_fill(dist <= 0, -1)
    return torch.where(first >= 0, first, positive.amax(-1).clamp_min(0))


def verify_sampling(
    draft_tokens: torch.Tensor,  # [b, k], x_i drawn from q_i
    q_probs: torch.Tensor,  # [b, k, V] processed draft distributions
    p_probs: torch.Tensor,  # [b, k+1, V] processed target distributions
    uniforms: torch.Tensor,  # [b, k] in [0, 1)
    u_last: torch.Tensor,  # [b] in [0, 1)
    draft_lens: torch.Tensor | None = None,  # [b] drafts to consider per row (<= k); None = all
) -> VerifyOutput:
    """Rejection sampling: accept x_i iff u_i · q_i(x_i) < p_i(x_i) (probability min(1, p/q),
    written without the division so q_i(x_i) == 0 cannot produce NaN); the extra token is drawn
    by inverse CDF with u_last from the residual norm(max(0, p_a − q_a)) where x_a was rejected,
    from p_a itself where the row ran out of drafts (bonus). The randomness is an input, so the
    `confidence_verify` plugin kernel reproduces this rule token for token."""
    b, k = draft_tokens.shape
    p_x = p_probs[:, :k].gather(2, draft_tokens[..., None]).squeeze(2).float()  # [b, k]
    q_x = q_probs.gather(2, draft_tokens[..., None]).squeeze(2).float()
    accept = (uniforms.float() * q_x < p_x) & _draft_valid(draft_tokens, draft_lens)
    num_accepted = accept.long().cumprod(-1).sum(-1)  # [b]

    lens = torch.full((b,), k, device=draft_tokens.device) if draft_lens is None else draft_lens
    rejected = num_accepted < lens  # [b]
    idx = num_accepted[:, None, None].expand(b, 1, p_probs.shape[-1])
    p_a = p_probs.gather(1, idx).squeeze(1).float()  # [b, V]
    q_a = q_probs.gather(1, idx.clamp_max(k - 1)).squeeze(1).float() if k else torch.zeros_like(p_a)
    residual = (p_a - q_a).clamp_min(0.0)
    use_residual = rejected & (residual.sum(-1) > 0)  # p == q leaves no residual: draw from p
    dist = torch.where(use_residual[:, None], residual, p_a)
    return _assemble(draft_tokens, num_accepted, inverse_cdf(dist, u_last))


def _groups(params: Sequence[SamplingParams]) -> tuple[list[int], list[int]]:
    """The rows verified by rejection sampling, and the Gumbel-coupled rows; the rest are greedy."""
    return [r for r, p in enumerate(params) if not p.greedy and not p.gumbel], coupled_rows(params)


def _merged(parts: list, num_rows: int, greedy: Callable[[], Verdict], fields: tuple[str, ...]) -> Verdict:
    """One step's verdict from its row groups' (rows, verdict) parts: a part that covers every row
    is the verdict; with greedy rows left, the greedy verdict of all rows (its argmax reads the
    logits in place, where taking the greedy rows out would copy them) with each part's rows
    overwritten by the part's `fields`; with none left, the parts scattered into a new verdict."""
    if len(parts) == 1 and len(parts[0][0]) == num_rows:
        return parts[0][1]
    if sum(len(rows) for rows, _ in parts) == num_rows:  # no greedy row: its argmax would go unread
        like = {name: getattr(parts[0][1], name) for name in fields}
        verdict = type(parts[0][1])(**{name: t.new_empty((num_rows, *t.shape[1:]))
                                       for name, t in like.items()})
    else:
        verdict = greedy()
    for rows, part in parts:
        idx = torch.tensor(rows, device=part.num_accepted.device)
        for name in fields:
            getattr(verdict, name)[idx] = getattr(part, name)
    return verdict


def _position(positions: Sequence[int] | None, row: int) -> int:
    if positions is None:
        raise ValueError("Gumbel-coupled rows need the positions their logits predict")
    return positions[row]


class Verifier:
    """Where a decoder's verification runs: these torch rules by default; the engine flavour
    substitutes its exported `confidence_verify_*` graphs (`trtspec.engine.verify.GraphVerifier`)."""

    def verify(self, draft_tokens: torch.Tensor, draft_lens: torch.Tensor, q_probs: torch.Tensor | None,
               target_logits: torch.Tensor, params: Sequence[SamplingParams],
               generators: Sequence[torch.Generator], positions: Sequence[int] | None = None) -> VerifyOutput:
        """One step's verdict for every row, each under its own request's sampling parameters:
        drafts [R, k] of which the first draft_lens [R] count, q_probs [R, k, V] (read for
        rejection-sampled rows only), target logits [R, k+1, V]. Gumbel-coupled rows (`spec.coupling`)
        take the greedy rule with the target's coupled samples for its argmax, row j of row r
        predicting position positions[r] + j."""
        sampled, coupled = _groups(params)
        parts: list[tuple[list[int], VerifyOutput]] = []
        if sampled:
            idx = torch.tensor(sampled, device=draft_tokens.device)
            k = draft_tokens.shape[1]
            p_probs = row_probs(target_logits[idx], [params[r] for r in sampled])  # [S, k+1, V]
            if q_probs is None:  # no sampling row drafted this step (their draft_lens are 0)
                if bool((draft_lens[idx] > 0).any()):
                    raise RuntimeError("sampling rows with drafts need their q_probs")
                q = p_probs.new_zeros(len(sampled), k, p_probs.shape[-1])
            else:
                q = q_probs[idx]  # [S, k, V]
            draws = [draw_uniforms(1, k, generators[r]) for r in sampled]
            uniforms = torch.cat([u for u, _ in draws])  # [S, k]
            u_last = torch.cat([u for _, u in draws])  # [S]
            parts.append((sampled, self.sampling(draft_tokens[idx], q, p_probs, uniforms, u_last,
                                                 draft_lens[idx])))
        if coupled:
            idx = torch.tensor(coupled, device=draft_tokens.device)
            width = target_logits.shape[1]
            at = [[_position(positions, r) + j for j in range(width)] for r in coupled]  # [C, k+1]
            choice = coupled_choice(target_logits[idx], [params[r] for r in coupled], at)  # [C, k+1]
            parts.append((coupled, verify_chosen(draft_tokens[idx], choice, draft_lens[idx])))
        greedy = partial(self.greedy, draft_tokens, target_logits, draft_lens)
        return _merged(parts, len(params), greedy, ("num_accepted", "tokens"))

    def greedy(self, draft_tokens: torch.Tensor, target_logits: torch.Tensor,
               draft_lens: torch.Tensor | None = None) -> VerifyOutput:
        return verify_greedy(draft_tokens, target_logits, draft_lens)

    def sampling(self, draft_tokens: torch.Tensor, q_probs: torch.Tensor, p_probs: torch.Tensor,
                 uniforms: torch.Tensor, u_last: torch.Tensor,
                 draft_lens: torch.Tensor | None = None) -> VerifyOutput:
        return verify_sampling(draft_tokens, q_probs, p_probs, uniforms, u_last, draft_lens)

    def verify_tree(self, tree: DraftTree, target_logits: torch.Tensor, params: Sequence[SamplingParams],
                    generators: Sequence[torch.Generator],
                    positions: Sequence[int] | None = None) -> TreeVerdict:
        """One step's verdict for every row's draft tree, each under its own request's parameters:
        target logits [R, N+1, V] at every row's root and nodes. Gumbel-coupled rows take the greedy
        rule with the target's coupled samples, a node at depth d of row r predicting position
        positions[r] + d."""
        from trtspec.spec.tree_verify import verify_tree_chosen

        sampled, coupled = _groups(params)
        sizes = list(tree.sizes)
        parts: list[tuple[list[int], TreeVerdict]] = []
        if sampled:
            idx = torch.tensor(sampled, device=tree.tokens.device)
            n = tree.width
            p_probs = row_probs(target_logits[idx], [params[r] for r in sampled])  # [S, N+1, V]
            draws = [draw_uniforms(1, n, generators[r]) for r in sampled]
            uniforms = torch.cat([u for u, _ in draws])  # [S, N]
            u_last = torch.cat([u for _, u in draws])  # [S]
            q = None if tree.q_probs is None else tree.q_probs[idx]
            parts.append((sampled, self.tree_sampling(tree.tokens[idx], tree.parents[idx],
                                                      [sizes[r] for r in sampled], p_probs, uniforms,
                                                      u_last, q)))
        if coupled:
            idx = torch.tensor(coupled, device=tree.tokens.device)
            depths = tree.depths()[idx, : target_logits.shape[1]].tolist()
            at = [[_position(positions, r) + d for d in row] for r, row in zip(coupled, depths, strict=True)]
            choice = coupled_choice(target_logits[idx], [params[r] for r in coupled], at)  # [C, N+1]
            parts.append((coupled, verify_tree_chosen(tree.tokens[idx], tree.parents[idx],
                                                      [sizes[r] for r in coupled], choice)))
        greedy = partial(self.tree_greedy, tree.tokens, tree.parents, sizes, target_logits)
        return _merged(parts, len(params), greedy, ("num_accepted", "path", "tokens"))

    def tree_greedy(self, tokens: torch.Tensor, parents: torch.Tensor, sizes: list[int],
                    target_logits: torch.Tensor) -> TreeVerdict:
        from trtspec.spec.tree_verify import verify_tree_greedy

        return verify_tree_greedy(tokens, parents, sizes, target_logits)

    def tree_sampling(self, tokens: torch.Tensor, parents: torch.Tensor, sizes: list[int],
                      p_probs: torch.Tensor, uniforms: torch.Tensor, u_last: torch.Tensor,
                      q_probs: torch.Tensor | None = None) -> TreeVerdict:
        from trtspec.spec.tree_verify import verify_tree_sampling

        return verify_tree_sampling(tokens, parents, sizes, p_probs, uniforms, u_last, q_probs)
