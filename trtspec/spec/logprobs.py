"""Log-probabilities of the emitted tokens, as OpenAI's `logprobs` and TensorRT-LLM's
`return_log_probs` return them.

Every emitted token (accepted, recovered or bonus) sits at a position whose target logits the
step's one forward computed: the verifier read them to decide it. So its log-probability under p
costs a log-softmax of logits already there, and it is exactly the target's, whatever the
drafter proposed. They are the *raw* log-probabilities: log_softmax of the target's logits before
temperature, top-k, top-p and the min_tokens ban (vLLM's default `logprobs_mode: raw_logprobs`),
so they do not depend on the request's sampling parameters and equal `log_softmax(model(ids))`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs (vLLM's default max_logprobs)


@dataclass(slots=True)
class TokenLogprobs:
    """Per emitted token: its log p, and the `top` most likely tokens with theirs (most likely first)."""

    top: int  # alternatives kept per token (0: the emitted token's own log p only)
    values: list[float] = field(default_factory=list)  # [n] log p(token)
    top_ids: list[list[int]] = field(default_factory=list)  # [n][top]
    top_values: list[list[float]] = field(default_factory=list)  # [n][top]

    def __len__(self) -> int:
        return len(self.values)

    def extend(self, other: TokenLogprobs) -> None:
        self.values += other.values
        self.top_ids += other.top_ids
        self.top_values += other.top_values

    def head(self, n: int) -> TokenLogprobs:
        """The first n tokens' (a step's tokens cut at an end id, max_tokens or a stop word)."""
        return TokenLogprobs(self.top, self.values[:n], self.top_ids[:n], self.top_values[:n])

    def cumulative(self) -> float:
        """log p of the whole output (TensorRT-LLM's cum_log_probs)."""
        return float(sum(self.values))


def step_logprobs(logits: torch.Tensor, positions: list[list[int]], tokens: list[list[int]],
                  tops: list[int]) -> list[TokenLogprobs]:
    """One step's log-probabilities for W requests at once: the values come to the host in one
    copy, the alternatives' ids in a second (none when no request wants alternatives).

    logits [W, s, V]: each request's target logits this step (taken before the min_tokens ban);
    positions[w]: where each of its emitted tokens[w] was predicted among its s rows (a chain:
    0..a; a tree: the root, then the accepted path's nodes); tops[w]: its alternatives per token."""
    w, n = len(tokens), max(len(t) for t in tokens)
    device = logits.device
    pos = torch.tensor([p + [0] * (n - len(p)) for p in positions], device=device)  # [W, n], 0-padded
    ids = torch.tensor([t + [0] * (n - len(t)) for t in tokens], device=device)  # [W, n]
    # only the rows that predicted an emitted token (a block of 16 drafts emits a + 1 of its 17)
    at = torch.log_softmax(logits[torch.arange(w, device=device)[:, None], pos].float(), dim=-1)  # [W, n, V]
    chosen = at.gather(2, ids[..., None])  # [W, n, 1]
    top = min(max(tops), at.shape[-1])
    best_ids = None
    if top:
        best = at.topk(top, dim=-1)  # [W, n, top]
        chosen, best_ids = torch.cat([chosen, best.values], -1), best.indices.tolist()
    floats = chosen.tolist()  # [W][n][1 + top]: the token's log p, then the best ones'
    out = []
    for r, (t, k) in enumerate(zip(tokens, tops, strict=True)):
        row = TokenLogprobs(k, [floats[r][j][0] for j in range(len(t))])
        row.top_values = [floats[r][j][1 : 1 + k] for j in range(len(t))]
        row.top_ids = [best_ids[r][j][:k] if k else [] for j in range(len(t))]
        out.append(row)
    return out


def prompt_logprobs(logits: torch.Tensor, prompt: list[int], top: int) -> TokenLogprobs:
    """logits [P-1, V] at the prompt's positions 0..P-2 -> the log-probabilities of its tokens 1..P-1
    (the first token has none: nothing predicts it)."""
    if len(prompt) < 2:
        return TokenLogprobs(top)
    return step_logprobs(logits[None], [list(range(len(prompt) - 1))], [prompt[1:]], [top])[0]
