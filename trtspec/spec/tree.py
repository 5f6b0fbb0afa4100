"""Draft trees: several candidate continuations per request, verified in one target forward.

A chain proposes one guess per position; a tree proposes several. Node 0 of a request's tree is its
root, the last verified token (fed first, as a chain feeds it); nodes 1..N are drafts, each
extending its parent by one token, numbered so that a parent comes before its children (by depth,
then by score). The target reads the tree flattened into its packed forward, each node seeing the
committed context and its ancestors only, at RoPE position start + depth (`trtspec.models.kv_slots`);
`trtspec.spec.tree_verify` accepts one root path and `TargetModel.keep_paths` keeps its K/V.

The shape is EAGLE-2's dynamic tree (Li et al. 2024), for every drafter (`grow_tree`):

    candidates of depth 1: the root's K best children
    expand: the K best candidates of the deepest depth (the frontier) each get their K best children;
            a candidate's score is its path's: the sum of log-scores from the root
    after `depth` levels (or once no later candidate can enter the top N): keep the N best
    candidates of all depths; a child never scores above its parent, so they form a tree
    (K is capped at the vocabulary size V, the frontier's width included: a toy vocabulary only)

What a drafter supplies is `expand`, the children's log-scores of a frontier:
- DFlash: ONE block forward gives per-slot marginals q_d, so a depth-d node's children score
  log q_{d+1} whatever the parent (the block is drafted once, then only re-ranked);
- DSpark: its Markov head conditions slot d + 1 on the token before it, so each frontier node's
  children are re-scored by the cheap head on that node's token, U_{d+1} + B(x_node, ·) (an RNN
  head continuing the state of the node's own root path, via `Expand`'s parent index), and its
  confidence c_{d+1} (σ of [h_{d+1}; W1[x_node]], the probability that slot d + 1 survives given
  its prefix did) turns q into a path-survival score: log min(1, c · q(x) / max q);
- EAGLE-3 and draft models: one forward per depth over every row's frontier, in tree attention.
Log-scores come from each row's processed q (temperature, top-k, top-p as for its chain; greedy
rows q at temperature 1), tokens outside the processed support are never proposed.

Children are chosen deterministically (the K best), so under sampling every node is a point-mass
draft and the tree verifier's rule for deterministic children applies (exact for any shape that
depends on the drafter's outputs only, `trtspec.spec.tree_verify`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from trtspec.spec.coupling import coupled_rows, gumbel_noise
from trtspec.spec.sampling import SamplingParams, row_probs

# the children's log-scores of a frontier: (depth d of the frontier, tokens [R, F], index of each
# frontier node's parent in the previous frontier [R, F] (−1: the root)) -> [R, F, V] ([R, 1, V]
# when the children do not depend on their parent), or already their K best: (scores, tokens)
# [R, F or 1, K]
Expand = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(slots=True)
class DraftTree:
    """The draft trees of R requests (padded to N nodes each)."""

    tokens: torch.Tensor  # [R, N] token of node i + 1
    parents: torch.Tensor  # [R, N] parent of node i + 1, in 0..i (0 = the root)
    sizes: list[int]  # nodes of each row; the rest is padding
    # [R, N+1, V] the law each node's children were drawn from without replacement, by node;
    # None: children chosen deterministically (top-k), each a point-mass draft
    q_probs: torch.Tensor | None = None
    node_depths: torch.Tensor | None = None  # [R, N+1] when known (`depths` computes it otherwise)

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    @classmethod
    def chain(cls, tokens: torch.Tensor, lens: Sequence[int] | None = None,
              q_probs: torch.Tensor | None = None) -> DraftTree:
        """A chain x_1..x_k as a tree (node i's parent is i − 1).  tokens [R, k]; q_probs [R, k, V]:
        the chain's q, q_i the law x_i was drawn from, which is node i − 1's children's (the tree's
        q_probs [R, k+1, V] is by node: the last node's row is zeros, it has no children)."""
        r, k = tokens.shape
        parents = torch.arange(k, device=tokens.device).expand(r, k).clone()
        if q_probs is not None:
            q_probs = torch.cat([q_probs, torch.zeros_like(q_probs[:, :1])], 1)  # [R, k+1, V]
        return cls(tokens, parents, list(lens) if lens is not None else [k] * r, q_probs)

    def row_parents(self, r: int) -> tuple[int, ...]:
        """Parents of row r's fed chunk [root, node 1..n]: −1 for the root."""
        return (-1, *self.parents[r, : self.sizes[r]].tolist())

    def depths(self) -> torch.Tensor:
        """[R, N+1] depth of every node (0 for the root)."""
        if self.node_depths is not None:
            return self.node_depths
        r, n = self.tokens.shape
        depth = torch.zeros(r, n + 1, dtype=torch.long, device=self.tokens.device)
        for i in range(n):  # parents come first
            depth[:, i + 1] = depth.gather(1, self.parents[:, i : i + 1])[:, 0] + 1
        return depth

    def truncated(self, max_depth: Sequence[int]) -> DraftTree:
        """Row r keeps its nodes at depth ≤ max_depth[r] (a prefix: nodes are ordered by depth)."""
        depth = self.depths()[:, 1:].tolist()
        sizes = [sum(1 for d in row[:n] if d <= m)
                 for row, n, m in zip(depth, self.sizes, max_depth, strict=True)]
        return DraftTree(self.tokens, self.parents, sizes, self.q_probs, self.node_depths)


def log_scores(logits: torch.Tensor, params: Sequence[SamplingParams],
               positions: torch.Tensor | None = None) -> torch.Tensor:
    """log q under each row's processed distribution (greedy rows: temperature 1).  logits [R, ..., V]
    Gumbel-coupled rows score log_softmax(log q + g), g their noise at the positions of the drafts
    these logits choose (`positions`, broadcastable to logits [R, ...] without V;
    `drafter.draft_positions`): a node's best child is its coupled draft, and scores stay ≤ 0, so
    they never grow along a path (a child never outranks its parent, which `grow_tree` relies on;
    log q + g alone, often positive, grew trees of orphans)."""
    if all(p.greedy for p in params):
        return torch.log_softmax(logits.float(), -1)
    as_sampled = [SamplingParams(temperature=1.0) if p.greedy else p for p in params]
    scores = row_probs(logits, as_sampled).log()
    coupled = coupled_rows(params)
    if coupled:
        if positions is None:
            raise ValueError("Gumbel-coupled rows need the positions of the drafts they score")
        r = logits.shape[0]
        at = positions.expand(logits.shape[:-1]).reshape(r, -1)  # [R, n], on the host
        idx = torch.tensor(coupled, device=logits.device)
        noise = gumbel_noise([params[i].seed for i in coupled], at[coupled], logits.shape[-1],
                             logits.device)  # [C, n, V]
        perturbed = scores[idx] + noise.view(len(coupled), *logits.shape[1:])
        scores[idx] = torch.log_softmax(perturbed, -1)
    return scores


def grow_tree(first: torch.Tensor, expand: Expand, topk: int, nodes: int, depth: int,
              guides: Sequence | None = None) -> DraftTree:
    """EAGLE-2's dynamic tree from the root's children log-scores `first` [R, V] (module docstring).
    guides: each row's `GuideState` or None; a guided row's children are only tokens its guide
    allows after the node's path (`expand` then returns full scores, not their K best)."""
    r = first.shape[0]
    device = first.device
    k = min(topk, first.shape[-1])
    guided = [i for i, g in enumerate(guides or ()) if g is not None]
    if guided:
        first = first.clone()
        for i in guided:
            _guide_children(guides[i], first[i : i + 1], [()])
    score, token = first.topk(k, -1)  # [R, K]
    # a guided row's frontier: each node's path from the root, its children masked after it
    paths = {i: [(t,) for t in token[i].tolist()] for i in guided}
    scores, tokens, parents, depths = [score], [token], [torch.full_like(token, -1)], [1]
    frontier_score, frontier_token = score, token
    frontier_id = torch.arange(k, device=device).expand(r, k)  # global candidate ids
    from_prev = torch.full_like(token, -1)
    total = k
    leaders = score  # [R, ≤ N] the best scores so far
    for d in range(2, depth + 1):
        # no later candidate can beat the frontier's best: stop once N candidates already do
        if total >= nodes and bool((leaders[:, -1] >= frontier_score[:, 0]).all()):
            break
        child = expand(d - 1, frontier_token, from_prev)
        f = frontier_token.shape[1]
        c_score, c_token = child if isinstance(child, tuple) else child.topk(k, -1)
        c_score, c_token = c_score.expand(r, f, k), c_token.expand(r, f, k)  # [R, F, K]
        if guided:
            if isinstance(child, tuple):
                raise ValueError("a guided tree needs each frontier's full children scores, not their K best")
            c_score, c_token = c_score.clone(), c_token.clone()
            for i in guided:
                masked = child[i].expand(f, -1).clone()  # [F, V]
                _guide_children(guides[i], masked, paths[i])
                c_score[i], c_token[i] = masked.topk(k, -1)
        cand = (frontier_score[:, :, None] + c_score).reshape(r, f * k)  # [R, F·K]
        cand_token = c_token.reshape(r, f * k)
        cand_parent = frontier_id[:, :, None].expand(r, f, k).reshape(r, f * k)
        scores.append(cand)
        tokens.append(cand_token)
        parents.append(cand_parent)
        depths.append(d)
        best_score, best = cand.topk(min(k, f * k), -1)  # the next frontier [R, K], best first
        leaders = torch.cat([leaders, best_score], 1).topk(min(nodes, leaders.shape[1] + best_score.shape[1]),
                                                            -1).values
        frontier_score, frontier_token = best_score, cand_token.gather(1, best)
        for i in guided:
            paths[i] = [paths[i][b // k] + (t,) for b, t in zip(best[i].tolist(), frontier_token[i].tolist(),
                                                              strict=True)]
        frontier_id = total + best
        from_prev = best // k  # index of its parent within the frontier just expanded
        total += f * k
    return _select(torch.cat(scores, 1), torch.cat(tokens, 1), torch.cat(parents, 1),
                   torch.cat([torch.full((r, s.shape[1]), d, device=device) for s, d in zip(scores, depths,
                                                                                         strict=True)], 1),
                   nodes)


def _guide_children(guide, scores: torch.Tensor, paths: list[tuple[int, ...]]) -> None:
    """Children log-scores scores [F, V] of frontier nodes at `paths`, in place: the tokens the guide
    refuses after each path −inf, the rest renormalized (a token the guide forces scores 0, so the
    tree follows what the guided target must write; a path with no child stays all −inf)."""
    guide.mask_paths(scores, paths)
    total = torch.logsumexp(scores, -1, keepdim=True)  # [F, 1]
    scores.sub_(total.masked_fill(total == float("-inf"), 0.0))


def _select(score: torch.Tensor, token: torch.Tensor, parent: torch.Tensor, depth: torch.Tensor,
            nodes: int) -> DraftTree:
    """The N best candidates as a tree ordered by depth then score.  all [R, C]; parent: candidate
    id, −1 for the root."""
    r, c = score.shape
    n = min(nodes, c)
    # stable: a child scoring the same as its parent (created earlier) stays behind it
    rank = torch.sort(score, dim=-1, descending=True, stable=True).indices[:, :n]  # [R, n] candidate ids
    sel_score = score.gather(1, rank)
    sizes = (sel_score > float("-inf")).sum(-1).tolist()
    order = torch.sort(depth.gather(1, rank) * n + torch.arange(n, device=score.device), dim=-1).indices
    chosen = rank.gather(1, order)  # [R, n] by depth, then score
    node_of = torch.zeros(r, c + 1, dtype=torch.long, device=score.device)  # candidate id + 1 -> node
    node_of.scatter_(1, chosen + 1, torch.arange(1, n + 1, device=score.device).expand(r, n))
    parents = node_of.gather(1, parent.gather(1, chosen) + 1)  # the root (−1) maps to node 0
    node_depths = torch.cat([torch.zeros(r, 1, dtype=torch.long, device=score.device),
                             depth.gather(1, chosen).long()], 1)
    tree = DraftTree(token.gather(1, chosen), parents, sizes, node_depths=node_depths)
    # −inf candidates sort last by score but not necessarily by depth: keep finite ones only
    if any(s < n for s in sizes):
        keep = sel_score.gather(1, order) > float("-inf")  # [R, n]
        tree = _compact(tree, keep)
    return tree


def _compact(tree: DraftTree, keep: torch.Tensor) -> DraftTree:
    """Drop nodes where keep [R, N] is False (never a kept node's ancestor), renumbering the rest."""
    r, n = keep.shape
    tokens, parents = torch.zeros_like(tree.tokens), torch.zeros_like(tree.parents)
    depths = torch.zeros_like(tree.depths())
    sizes = []
    for row in range(r):
        idx = keep[row].nonzero()[:, 0]
        new_of = torch.zeros(n + 1, dtype=torch.long, device=keep.device)
        new_of[idx + 1] = torch.arange(1, len(idx) + 1, device=keep.device)
        tokens[row, : len(idx)] = tree.tokens[row, idx]
        parents[row, : len(idx)] = new_of[tree.parents[row, idx]]
        depths[row, 1 : len(idx) + 1] = tree.depths()[row, idx + 1]
        sizes.append(len(idx))
    return DraftTree(tokens, parents, sizes, tree.q_probs, depths)
