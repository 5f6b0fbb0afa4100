"""Tree verification: which root path of a draft tree the target keeps, in one target forward.

Inputs per request: the tree (`trtspec.spec.tree.DraftTree`: node tokens, parents, size; node 0 is
the root, the last verified token) and the target's distribution p_u at every node u, from ONE
forward over the flattened tree (p_u is the law of the token after u's root path). Output: the
accepted root path u_0 = root, u_1, …, u_a (a accepted drafts), then one recovered/bonus token, as
a chain emits a + 1 tokens. A chain is the tree whose node i has parent i − 1.

Greedy: walk from the root; at node u let t = argmax p_u; if a child of u carries t, accept it
(the first such child) and continue there; otherwise emit t and stop. The emitted tokens are the
target's greedy continuation, token for token, whatever the tree.

Sampling, children chosen deterministically (top-k; every trtspec drafter): at node u, with
r = p_u (processed by temperature/top-k/top-p) and its children c_1, c_2, … in order,

    child c_j with token x: accept with probability r(x) / Σr; else set r(x) = 0 (renormalise)
    and try c_{j+1}; a child whose token was already rejected is rejected (r(x) = 0 by now)
    a child accepted: continue at it with r = p_{c_j};  none accepted: draw the last token from r

Each child is a speculative-sampling step whose draft is the point mass δ_x: the accept test
min(1, r(x)/δ_x(x)) = r(x)/Σr, and the residual norm(max(0, r − δ_x)) is r with x removed. Exactness,
by induction on the number of children m left at u: the token emitted at u has law r. m = 0: it is
drawn from r. m > 0: P(emit y) = P(accept, x = y) + P(reject) · r'(y) where r' = r without x, so for
y = x it is r(x) + 0, and for y ≠ x it is (1 − r(x)) · r(y) / (1 − r(x)) = r(y). An accepted child
becomes the next token and the walk continues from its node with p of the extended prefix, so by
the chain rule the whole emitted sequence has the target's law (Leviathan et al. 2023, the
multi-candidate form of EAGLE and SpecInfer). The tree's shape and tokens may depend on anything
but the current verdict (for a deterministic drafter they are functions of the committed tokens).

Sampling, children drawn from q without replacement (Jeon et al. 2024, recursive rejection
sampling): c_1 ~ q_u, c_2 ~ q_u without x_1, …; starting from r = p_u and s = q_u,

    child c_j with token x: accept with probability min(1, r(x)/s(x)); else
    r ← norm(max(0, r − s)) and s ← s without x, renormalised; next child
    none accepted: draw from r

Exact by the same induction, now with the speculative-sampling lemma: if x ~ s and the output is x
when accepted, else a draw with law r' = norm(max(0, r − s)), the output has law r; the tries after
a rejection form such a draw because r' does not depend on x, and given the history the next child
is distributed as the updated s — which is why the number of children and their order must not
depend on their own values (draw all of them, or decide from earlier siblings only). A
deterministic child is the case s = δ_x. `DraftTree.q_probs` selects this rule; no drafter in
trtspec emits sampled trees yet (their dynamic shape picks children by their own scores).

Randomness is an input, as for chains (`trtspec.spec.verify`): uniforms [R, N] (node i's test uses
uniforms[:, i − 1]) and u_last [R] for the last token, drawn by inverse CDF. The mass left at u is
1 − Σ r(rejected) (p is normalised), in float64, so the `confidence_verify` tree kernel and the
ONNX graph reproduce this rule token for token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trtspec.spec.verify import PAD, inverse_cdf


@dataclass(slots=True)
class TreeVerdict:
    num_accepted: torch.Tensor  # [R] accepted drafts (the depth of the last accepted node)
    path: torch.Tensor  # [R, N] accepted nodes (1..N) root first, PAD after
    tokens: torch.Tensor  # [R, N+1] accepted tokens then the recovered/bonus token, PAD after

    def row(self, r: int) -> list[int]:
        return self.tokens[r, : int(self.num_accepted[r]) + 1].tolist()


def _children(parents: list[int], size: int) -> list[list[int]]:
    """children[u] = nodes (1-based) whose parent is u, in order."""
    kids: list[list[int]] = [[] for _ in range(size + 1)]
    for i, p in enumerate(parents[:size]):
        kids[p].append(i + 1)
    return kids


def _verdict(paths: list[list[int]], last: list[int], tokens: list[list[int]], width: int,
             device) -> TreeVerdict:
    r = len(paths)
    path = torch.full((r, width), PAD, dtype=torch.long)
    out = torch.full((r, width + 1), PAD, dtype=torch.long)
    for row, nodes in enumerate(paths):
        a = len(nodes)
        if a:
            path[row, :a] = torch.tensor(nodes)
            out[row, :a] = torch.tensor([tokens[row][u - 1] for u in nodes])
        out[row, a] = last[row]
    return TreeVerdict(torch.tensor([len(p) for p in paths]).to(device), path.to(device), out.to(device))


def verify_tree_greedy(tokens: torch.Tensor, parents: torch.Tensor, sizes: Sequence[int],
                       target_logits: torch.Tensor) -> TreeVerdict:
    """tokens, parents [R, N]; sizes [R]; target_logits [R, N+1, V] at the root and every node."""
    return verify_tree_chosen(tokens, parents, sizes, target_logits.argmax(-1))


def verify_tree_chosen(tokens: torch.Tensor, parents: torch.Tensor, sizes: Sequence[int],
                       target_choice: torch.Tensor) -> TreeVerdict:
    """The greedy rule with the target's pick at the root and every node given, target_choice
    [R, N+1] (greedy: its argmax; Gumbel coupling: its coupled sample): follow the child that is
    the pick while there is one, then emit the pick there."""
    argmax = target_choice.tolist()  # [R, N+1]
    toks, pars = tokens.tolist(), parents.tolist()
    paths, last = [], []
    for row in range(len(toks)):
        kids = _children(pars[row], sizes[row])
        u, path = 0, []
        while True:
            t = argmax[row][u]
            nxt = next((c for c in kids[u] if toks[row][c - 1] == t), None)
            if nxt is None:
                break
            path.append(nxt)
            u = nxt
        paths.append(path)
        last.append(argmax[row][u])
    return _verdict(paths, last, toks, tokens.shape[1], tokens.device)


def verify_tree_sampling(tokens: torch.Tensor, parents: torch.Tensor, sizes: Sequence[int],
                         p_probs: torch.Tensor, uniforms: torch.Tensor, u_last: torch.Tensor,
                         q_probs: torch.Tensor | None = None) -> TreeVerdict:
    """tokens, parents [R, N]; p_probs [R, N+1, V] processed target distributions at the root and
    every node; uniforms [R, N]; u_last [R]; q_probs [R, N+1, V] (children drawn from q_u without
    replacement) or None (deterministic children)."""
    r, n = tokens.shape
    v = p_probs.shape[-1]
    toks, pars = tokens.tolist(), parents.tolist()
    u_list = uniforms.double().tolist()
    flat = p_probs.reshape(r * (n + 1), v)
    # r(x) of every node's token under its parent's p, read once: [R, N]
    at_parent = torch.arange(r, device=tokens.device)[:, None] * (n + 1) + parents  # [R, N] rows of flat
    p_x = flat[at_parent, tokens].double().tolist()
    paths, residuals = [], []
    for row in range(r):
        kids = _children(pars[row], sizes[row])
        if q_probs is None:
            path, u, rejected = _walk_point_mass(kids, toks[row], p_x[row], u_list[row])
            dist = p_probs[row, u].double()
            if rejected:
                dist = dist.index_fill(0, torch.tensor(rejected, device=dist.device), 0.0)
            if not bool(dist.sum() > 0):  # only float rounding rejects all of p's mass
                dist = p_probs[row, u].double()
        else:
            path, dist = _walk_recursive(kids, toks[row], p_probs[row], q_probs[row], u_list[row])
        paths.append(path)
        residuals.append(dist)
    last = inverse_cdf(torch.stack(residuals), u_last).tolist()
    return _verdict(paths, last, toks, n, tokens.device)


def _walk_point_mass(kids: list[list[int]], toks: list[int], p_x: list[float],
                     uniforms: list[float]) -> tuple[list[int], int, list[int]]:
    """The deterministic-children walk: (accepted nodes, last node, tokens rejected at it)."""
    u, path = 0, []
    while True:
        rejected: list[int] = []
        gone = 0.0  # r's mass removed at u so far
        for c in kids[u]:
            x = toks[c - 1]
            r_x = 0.0 if x in rejected else p_x[c - 1]
            if uniforms[c - 1] * (1.0 - gone) < r_x:
                break
            rejected.append(x)
            gone += r_x
        else:
            return path, u, rejected
        path.append(c)
        u = c


def _walk_recursive(kids: list[list[int]], toks: list[int], p: torch.Tensor, q: torch.Tensor,
                    uniforms: list[float]) -> tuple[list[int], torch.Tensor]:
    """Recursive rejection sampling (children sampled from q_u without replacement): (accepted
    nodes, the law of the last token)."""
    u, path = 0, []
    while True:
        r, s = p[u].double(), q[u].double()
        for c in kids[u]:
            x = toks[c - 1]
            if uniforms[c - 1] * s[x] < r[x]:  # probability min(1, r(x)/s(x)), no division
                break
            residual = (r - s).clamp_min(0.0)
            if residual.sum() > 0:
                r = residual / residual.sum()
            s = s.clone()
            s[x] = 0.0
            if s.sum() > 0:
                s = s / s.sum()
        else:
            return path, r
        path.append(c)
        u = c
