"""DSpark's sequential heads (DeepSpec `markov_head_type`): a bias on slot k's parallel logits U_k
from the token drafted before it, so the block is sampled left to right.

Notation: x_{k−1} the previous token (x_0 = the anchor), h_k the backbone's hidden state of slot
k [H], e = W1[x_{k−1}] [r] (`markov_w1: Embedding(V, r)`), W2 = `markov_w2: Linear(r, V, no bias)`.

    vanilla  B_k = W2 · e                                   (DeepSpec `VanillaMarkov`)
    gated    g = σ(gate_proj([h_k ; e])),  B_k = W2 · (g ⊙ e) (`GatedMarkovHead`;
             gate_proj: Linear(H + r, r) with bias)
    rnn      [g ; c ; o] = joint_proj([s_{k−1} ; e ; h_k])  (`RNNHead`; joint_proj: Linear(2r + H, 3r)
             with bias, split in this order), s_0 = 0,
             s_k = σ(g) ⊙ s_{k−1} + (1 − σ(g)) ⊙ tanh(c),   B_k = W2 · tanh(o)

p_k ∝ exp(U_k + B_k). vanilla and gated are memoryless (B_k depends on x_{k−1} and h_k only); the
RNN head's state s_k carries the whole prefix x_0..x_{k−1}, so each drafted path (a chain, or a
tree's root-to-node path) has its own state. Checkpoint names: `markov_head.` + the names above.
"""

from __future__ import annotations

import torch
from torch import nn

MarkovState = torch.Tensor | None  # [..., r] for the RNN head; None for the memoryless heads


class VanillaMarkovHead(nn.Module):
    """B(x, ·) = W2(W1[x]): a rank-r bigram correction of the parallel logits."""

    head_type = "vanilla"
    state_size = 0  # r of the state a head carries from slot to slot (0: memoryless)

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def initial_state(self, shape: tuple[int, ...], like: torch.Tensor) -> MarkovState:
        """s_0 of `shape` paths (None: the head keeps no state)."""
        return None

    def step(self, prev_tokens: torch.Tensor, hidden: torch.Tensor,
             state: MarkovState) -> tuple[torch.Tensor, MarkovState]:
        """One slot.  prev_tokens [...]; hidden [..., H]; state [..., r] | None -> (B [..., V], state)"""
        return self.markov_w2(self.markov_w1(prev_tokens)), None

    def teacher_forced(self, prev_tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Every slot of a block at once, x_{k−1} given.  prev_tokens [..., γ]; hidden [..., γ, H]
        -> B [..., γ, V]"""
        return self.step(prev_tokens, hidden, None)[0]


class GatedMarkovHead(VanillaMarkovHead):
    """B(x, ·) = W2(σ(gate_proj([h ; W1[x]])) ⊙ W1[x])."""

    head_type = "gated"

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__(vocab_size, rank, hidden_size)
        self.gate_proj = nn.Linear(hidden_size + rank, rank)

    def step(self, prev_tokens, hidden, state):
        e = self.markov_w1(prev_tokens)  # [..., r]
        gate = torch.sigmoid(self.gate_proj(torch.cat([hidden.to(e.dtype), e], -1)))
        return self.markov_w2(gate * e), None


class RNNMarkovHead(VanillaMarkovHead):
    """A GRU-like cell over the block: slot k sees x_0..x_{k−1} through its state s_{k−1}."""

    head_type = "rnn"

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__(vocab_size, rank, hidden_size)
        self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)
        self.state_size = rank

    def initial_state(self, shape, like):
        # DeepSpec keeps the state in the hidden states' dtype
        return torch.zeros(*shape, self.state_size, dtype=like.dtype, device=like.device)

    def step(self, prev_tokens, hidden, state):
        e = self.markov_w1(prev_tokens).to(hidden.dtype)  # [..., r]
        if state is None:
            state = self.initial_state(e.shape[:-1], hidden)
        gate, candidate, out = self.joint_proj(torch.cat([state, e, hidden], -1)).chunk(3, -1)
        gate = torch.sigmoid(gate)
        state = gate * state + (1.0 - gate) * torch.tanh(candidate)
        return self.markov_w2(torch.tanh(out).to(self.markov_w2.weight.dtype)), state

    def teacher_forced(self, prev_tokens, hidden):
        state, biases = None, []
        for k in range(prev_tokens.shape[-1]):
            bias, state = self.step(prev_tokens[..., k], hidden[..., k, :], state)
            biases.append(bias)
        return torch.stack(biases, -2)


MARKOV_HEADS: dict[str, type[VanillaMarkovHead]] = {
    head.head_type: head for head in (VanillaMarkovHead, GatedMarkovHead, RNNMarkovHead)
}
# the tensors each head type adds to markov_w1 / markov_w2, as DeepSpec saves them
MARKOV_HEAD_TENSORS = {"vanilla": (), "gated": ("gate_proj.weight", "gate_proj.bias"),
                       "rnn": ("joint_proj.weight", "joint_proj.bias")}
