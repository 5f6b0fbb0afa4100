"""Exact law of draft-tree verification: what the sampling tree rules emit (the torch rules and the
ONNX tree graph), integrated over the drafter's trees and every uniform of the rule, continued by
the target, is the target's law to 1e-12 (tests/test_verify.py does the same for chains).

A 3-token vocabulary; p(· | prefix) in eighths and q(· | prefix) in quarters, both depending on the
prefix. Every value the rule compares a uniform with is a fraction computed here exactly, from the
rule as `trtspec.spec.tree_verify` states it: a child's accept threshold (deterministic children:
r(x) / (1 − Σ r(rejected siblings)), a repeated token 0; children drawn from q without replacement:
min(1, r(x) / s(x)) with r ← norm(max(0, r − s)) and s ← s without x after each rejection) and the
cumulative sums of the law the last token is drawn from at the last node. The rule is constant
between those points, so one evaluation inside each cell, weighted by its width, integrates it
exactly. Each cell is evaluated just inside both of its ends: a rule whose threshold or last law
is not the stated one changes its verdict inside some cell, and its law comes out wrong even where
one midpoint would not notice.

Only the uniforms a verdict consulted are enumerated (the children tested at each node of the
accepted path, up to the accepted one and all of them at the last node; then u_last): the rule runs
with the rest unset and the enumeration branches on the first consulted one not yet set. The
others (later siblings, other subtrees, padding past a row's size) must not matter: each verdict is
taken with all of them just above 0 and again just below 1.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
from dataclasses import dataclass, replace
from fractions import Fraction

import pytest
import torch

from trtspec.spec import tree_verify
from trtspec.spec.tree_verify import verify_tree_sampling

V = 3
EDGE = 1e-6  # how far inside a cell's ends the rule is evaluated (cells are wider than 1/100)
_P8 = [(4, 3, 1), (1, 1, 6), (2, 5, 1), (0, 3, 5), (3, 3, 2), (1, 6, 1), (5, 0, 3), (2, 2, 4),
       (6, 1, 1), (3, 0, 5), (1, 4, 3)]
_Q4 = [(2, 1, 1), (1, 2, 1), (0, 2, 2), (1, 1, 2), (3, 1, 0), (2, 0, 2), (1, 3, 0)]


def _p(prefix: tuple[int, ...]) -> tuple[Fraction, ...]:
    """The target's next-token law after `prefix` (one of 11 rows, by the prefix)."""
    key = sum((t + 1) * 4**i for i, t in enumerate(prefix))
    return tuple(Fraction(c, 8) for c in _P8[key % len(_P8)])


def _q(prefix: tuple[int, ...]) -> tuple[Fraction, ...]:
    key = sum((t + 1) * 3**i for i, t in enumerate(prefix))
    return tuple(Fraction(c, 4) for c in _Q4[key % len(_Q4)])


@dataclass(frozen=True)
class Tree:
    start: tuple[int, ...]  # the tokens before the root's prediction
    parents: tuple[int, ...]  # of node i + 1, 0 = the root
    tokens: tuple[int, ...]
    weight: Fraction = Fraction(1)  # the probability that the drafter proposes this tree

    def prefix(self, u: int) -> tuple[int, ...]:
        """The tokens before node u's prediction: the start, then u's root path."""
        path = []
        while u:
            path.append(self.tokens[u - 1])
            u = self.parents[u - 1]
        return self.start + tuple(reversed(path))

    def kids(self, u: int) -> list[int]:
        return [i + 1 for i, par in enumerate(self.parents) if par == u]

    @property
    def depth(self) -> int:
        return max((len(self.prefix(u)) - len(self.start) for u in range(len(self.tokens) + 1)), default=0)


@dataclass
class Cuts:
    """Where the stated rule's verdict can change: each node's accept threshold, and the law of the
    last token at each node where the walk can stop."""

    accept: dict[int, Fraction]
    last: dict[int, tuple[Fraction, ...]]


def _normalised(dist) -> tuple[Fraction, ...]:
    total = sum(dist)
    return tuple(d / total for d in dist) if total > 0 else tuple(dist)


def _point_mass_cuts(tree: Tree) -> Cuts:
    cuts = Cuts({}, {})
    for u in range(len(tree.tokens) + 1):
        r = list(_p(tree.prefix(u)))
        mass = Fraction(1)
        for c in tree.kids(u):
            x = tree.tokens[c - 1]
            cuts.accept[c] = r[x] / mass if mass > 0 else Fraction(1)
            mass -= r[x]
            r[x] = Fraction(0)
        cuts.last[u] = _normalised(r)
    return cuts


def _recursive_cuts(tree: Tree) -> Cuts:
    cuts = Cuts({}, {})
    for u in range(len(tree.tokens) + 1):
        r, s = _p(tree.prefix(u)), list(_q(tree.prefix(u)))
        for c in tree.kids(u):
            x = tree.tokens[c - 1]
            cuts.accept[c] = min(Fraction(1), r[x] / s[x])
            r = _normalised([max(Fraction(0), a - b) for a, b in zip(r, s, strict=True)])
            s[x] = Fraction(0)
            s = list(_normalised(s))
        cuts.last[u] = r
    return cuts


def _points(cuts) -> list[tuple[float, float]]:
    """(uniform, weight) pairs integrating a function of one uniform that is constant between the
    fractions `cuts`: just inside both ends of every cell, half the cell's width each."""
    ends = sorted({Fraction(0), Fraction(1), *(c for c in cuts if 0 < c < 1)})
    out = []
    for lo, hi in itertools.pairwise(ends):
        assert hi - lo > 4 * EDGE
        out += [(float(lo) + EDGE, float(hi - lo) / 2), (float(hi) - EDGE, float(hi - lo) / 2)]
    return out


def _consulted(tree: Tree, path: list[int]) -> list[int]:
    """The nodes whose uniforms a walk along `path` tested, in order."""
    walk, out = [0, *path], []
    for i, u in enumerate(walk):
        nxt = walk[i + 1] if i + 1 < len(walk) else None
        for c in tree.kids(u):
            out.append(c)
            if c == nxt:
                break
    return out


def _float_rows(dists, width: int) -> torch.Tensor:
    rows = [[float(x) for x in d] for d in dists]
    return torch.tensor(rows + [rows[0]] * (width - len(rows)), dtype=torch.float32)


@dataclass(frozen=True)
class _Row:
    """One point of the enumeration: a tree, the uniforms set so far and the mass they stand for."""

    tree: int
    uniforms: dict[int, float]  # by node
    u_last: float | None
    rest: float  # every uniform not set
    mass: float


def _tree_inputs(trees: list[Tree], pad: list[int]) -> tuple[torch.Tensor, ...]:
    """tokens, parents [T, n], p, q [T, n+1, V] of every tree, with two padding nodes past each
    tree's size: children of the root carrying token pad[t], which a rule reading past a row's size
    would accept."""
    n = max(len(t.tokens) for t in trees) + 2
    tokens = torch.tensor([[*t.tokens, *[x] * (n - len(t.tokens))] for t, x in zip(trees, pad, strict=True)])
    parents = torch.tensor([[*t.parents, *[0] * (n - len(t.parents))] for t in trees])
    p = torch.stack([_float_rows([_p(t.prefix(u)) for u in range(len(t.tokens) + 1)], n + 1) for t in trees])
    q = torch.stack([_float_rows([_q(t.prefix(u)) for u in range(len(t.tokens) + 1)], n + 1) for t in trees])
    return tokens, parents, p, q


def _enumerated_law(rule, trees: list[Tree], cuts_of, sampled: bool) -> dict[tuple[int, ...], float]:
    """P(the rule emits exactly this token sequence), over the trees and all of its uniforms.
    rule: verify_tree_sampling's signature; sampled: give it each node's q (children drawn from q).
    The uniforms a verdict did not consult are set all just above 0, then all just below 1 (half the
    mass each): they must not change it."""
    cuts = [cuts_of(t) for t in trees]
    pad = [max(range(V), key=c.last[0].__getitem__) for c in cuts]  # the root's likeliest last token
    tokens, parents, p, q = _tree_inputs(trees, pad)
    n = tokens.shape[1]
    rows = [_Row(i, {}, None, 0.5, float(t.weight)) for i, t in enumerate(trees)]
    law: dict[tuple[int, ...], float] = {}
    while rows:
        idx = torch.tensor([row.tree for row in rows])
        uniforms = torch.tensor([[row.uniforms.get(c, row.rest) for c in range(1, n + 1)] for row in rows],
                                dtype=torch.float32)  # [B, n]
        u_last = torch.tensor([0.5 if row.u_last is None else row.u_last for row in rows])  # [B]
        sizes = [len(trees[i].tokens) for i in idx.tolist()]
        out = rule(tokens[idx], parents[idx], sizes, p[idx], uniforms, u_last, *([q[idx]] if sampled else []))
        nxt = []
        verdicts = zip(out.num_accepted.tolist(), out.path.tolist(), out.tokens.tolist(), strict=True)
        for row, (a, path, emitted) in zip(rows, verdicts, strict=True):
            tree, path = trees[row.tree], path[:a]
            assert all(1 <= c <= len(tree.tokens) for c in path), f"accepted a padding node: {path}"
            missing = next((c for c in _consulted(tree, path) if c not in row.uniforms), None)
            if row.u_last is not None:
                assert missing is None, f"the verdict read node {missing}'s uniform, its walk did not test it"
                law[tuple(emitted[: a + 1])] = law.get(tuple(emitted[: a + 1]), 0.0) + row.mass
            elif missing is not None:
                nxt += [replace(row, uniforms={**row.uniforms, missing: u}, mass=row.mass * w)
                        for u, w in _points([cuts[row.tree].accept[missing]])]
            else:
                last_law = cuts[row.tree].last[path[-1] if path else 0]
                nxt += [replace(row, u_last=u, rest=rest, mass=row.mass * w / 2)
                        for u, w in _points(itertools.accumulate(last_law)) for rest in (EDGE, 1 - EDGE)]
        rows = nxt
    return law


def _assert_target_law(law: dict[tuple[int, ...], float], start: tuple[int, ...], length: int) -> None:
    """Each emitted sequence s continued by the target must give every sequence of `length` tokens
    its probability under p: Σ_s P(s) Π_{j ≥ |s|} p(z_j | z_<j) = Π_j p(z_j | z_<j)."""
    assert all(1 <= len(s) <= length for s in law)
    for z in itertools.product(range(V), repeat=length):
        probs = [float(_p(start + z[:j])[z[j]]) for j in range(length)]
        got = sum(m * math.prod(probs[len(s):]) for s, m in law.items() if z[: len(s)] == s)
        assert got == pytest.approx(math.prod(probs), abs=1e-12), (z, got, math.prod(probs))


# -- deterministic children (every trtspec drafter) -------------------------------------------
# Node i + 1 has parent PARENTS[i]; each a fixed tree (a deterministic drafter's tree is a function
# of the committed tokens).
POINT_MASS = {
    # three children of the root, the third repeating the first; depth 3 under the first; node 8
    # drafts a token p rules out (p(1 | 0, 1) = 0)
    "siblings-repeat-depth3": Tree((), (0, 0, 0, 1, 1, 2, 4, 5), (0, 1, 0, 2, 1, 0, 1, 1)),
    # every token a child of the root (the last one tested takes all that is left)
    "every-token": Tree((1,), (0, 0, 0, 1, 3, 3), (2, 0, 1, 1, 0, 2)),
    # a chain
    "chain": Tree((2,), (0, 1, 2), (2, 0, 2)),
}


@functools.cache
def _graph():
    from trtspec.engine.ort import OrtSession
    from trtspec.engine.verify import GraphVerifier
    from trtspec.export.verify import export_verify_tree_sampling

    return GraphVerifier(None, None, None, OrtSession(export_verify_tree_sampling(V)))


def _run_graph(tokens, parents, sizes, p, uniforms, u_last):
    """The `confidence_verify_tree_sampling` graph under onnxruntime."""
    return _graph().tree_sampling(tokens, parents, sizes, p, uniforms, u_last)


@pytest.mark.parametrize("rule", [verify_tree_sampling, _run_graph], ids=["torch", "onnx"])
@pytest.mark.parametrize("case", list(POINT_MASS))
def test_deterministic_children_give_the_target_s_law_exactly(case, rule):
    """Several children per node, a repeated token, a token p rules out, depth 3, a chain, padding
    nodes past a row's size: the joint law of everything a verdict emits is the target's."""
    tree = POINT_MASS[case]
    law = _enumerated_law(rule, [tree], _point_mass_cuts, sampled=False)
    assert max(len(s) for s in law) == tree.depth + 1  # whole paths were accepted
    _assert_target_law(law, tree.start, tree.depth + 1)


# -- children drawn from q without replacement (recursive rejection sampling) ----------------

def _sampled_trees(start: tuple[int, ...], parents: tuple[int, ...]) -> list[Tree]:
    """Every tree of this shape whose children of node u are drawn from q(· | u's prefix) without
    replacement, in draw order, with its probability."""
    trees = [Tree(start, parents, ())]
    for i, par in enumerate(parents):
        grown = []
        for t in trees:
            q = _q(Tree(start, parents[:i], t.tokens).prefix(par))
            before = [t.tokens[j] for j in range(i) if parents[j] == par]
            left = 1 - sum(q[x] for x in before)
            grown += [Tree(start, parents, (*t.tokens, x), t.weight * q[x] / left)
                      for x in range(V) if x not in before and q[x] > 0]
        trees = grown
    return trees


SAMPLED = {
    # two children of the root, two under the first of them
    "two-by-two": ((), (0, 0, 1, 1)),
    # three children of the root (q's whole support), one under the second, one under that
    "three-then-chain": ((0,), (0, 0, 0, 2, 4)),
    # two children of the root (q's whole support), one under the second
    "two-then-one": ((1,), (0, 0, 2)),
}


@pytest.mark.parametrize("case", list(SAMPLED))
def test_children_drawn_without_replacement_give_the_target_s_law_exactly(case):
    start, parents = SAMPLED[case]
    trees = _sampled_trees(start, parents)
    assert sum(t.weight for t in trees) == 1
    law = _enumerated_law(verify_tree_sampling, trees, _recursive_cuts, sampled=True)
    depth = trees[0].depth
    assert max(len(s) for s in law) == depth + 1
    _assert_target_law(law, start, depth + 1)


# -- the test catches the rules' plausible slips ---------------------------------------------

def _mutant(old: str, new: str):
    """verify_tree_sampling of `trtspec.spec.tree_verify` with `old` (found once) replaced by `new`."""
    source = inspect.getsource(tree_verify)
    assert source.count(old) == 1, old
    namespace = {"__name__": "tree_verify_mutant"}
    exec(compile(source.replace(old, new), "<tree_verify mutant>", "exec"), namespace)
    return namespace["verify_tree_sampling"]


POINT_MASS_SLIPS = {
    "no renormalisation (accept with probability r(x))": ("uniforms[c - 1] * (1.0 - gone) < r_x",
                                                          "uniforms[c - 1] < r_x"),
    "a repeated token keeps its mass": ("0.0 if x in rejected else p_x[c - 1]", "p_x[c - 1]"),
    "rejected mass not taken off for later siblings": ("gone += r_x", "gone += 0.0"),
    "last token from p, its rejected children kept": ("if rejected:", "if False:"),
    "nodes past a row's size tested": ("kids = _children(pars[row], sizes[row])\n        if q_probs",
                                       "kids = _children(pars[row], n)\n        if q_probs"),
    "last token from the root's p": ("dist = p_probs[row, u].double()\n            if rejected:",
                                     "dist = p_probs[row, 0].double()\n            if rejected:"),
}
RECURSIVE_SLIPS = {
    "residual not updated between siblings": ("r = residual / residual.sum()", "r = r"),
    "residual not renormalised": ("r = residual / residual.sum()", "r = residual"),
    "later siblings tested against q (as if drawn with replacement)": ("s[x] = 0.0", "s[x] = s[x]"),
    "q without x not renormalised": ("s = s / s.sum()", "s = s"),
    "last token from p after rejections": ("return path, r", "return path, p[u].double()"),
    "deterministic rule for sampled children": ("q_probs is None:", "True:"),
}


def _follows_target(rule, trees: list[Tree], cuts_of, sampled: bool) -> bool:
    try:
        law = _enumerated_law(rule, trees, cuts_of, sampled)
        _assert_target_law(law, trees[0].start, trees[0].depth + 1)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("slip", list(POINT_MASS_SLIPS))
def test_a_slip_in_the_deterministic_rule_is_caught(slip):
    """Each slip gives some tree of POINT_MASS a law other than the target's (a chain, with no
    siblings, does not notice the siblings' slips)."""
    rule = _mutant(*POINT_MASS_SLIPS[slip])
    assert not all(_follows_target(rule, [tree], _point_mass_cuts, False) for tree in POINT_MASS.values())


@pytest.mark.parametrize("slip", list(RECURSIVE_SLIPS))
def test_a_slip_in_the_recursive_rule_is_caught(slip):
    rule = _mutant(*RECURSIVE_SLIPS[slip])
    assert not _follows_target(rule, _sampled_trees(*SAMPLED["two-then-one"]), _recursive_cuts, True)
