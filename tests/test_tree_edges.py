"""Draft trees at their edges (`spec.tree`, `spec.tree_verify`): depths computed from parents, the
plain EAGLE-2 expansion over random path-dependent scores, trees with fewer finite candidates
than nodes, guided trees, log-scores of every row kind, and the verifiers' rounding and
zero-probability edges."""

from __future__ import annotations

import pytest
import torch

from trtspec.spec.coupling import coupled_choice
from trtspec.spec.grammar import Guide, GuideCompiler, GuideState
from trtspec.spec.sampling import SamplingParams, row_probs
from trtspec.spec.tree import DraftTree, grow_tree, log_scores
from trtspec.spec.tree_verify import verify_tree_chosen, verify_tree_sampling
from trtspec.tokenizer import ByteTokenizer

# -- depths and truncation -------------------------------------------------------------------

# nodes 1..9 by depth: three children of the root, two under node 1, one under node 2, then a chain
BY_DEPTH = [0, 0, 0, 1, 1, 2, 4, 5, 7]
BY_DEPTH_DEPTHS = [0, 1, 1, 1, 2, 2, 2, 3, 3, 4]  # root first


def test_depths_follow_the_parents_when_the_tree_does_not_know_them():
    """A tree built from tokens and parents alone computes each node's depth from its parent's (the
    root 0), also for a tree not ordered by depth; padding past a row's size does not matter."""
    parents = torch.tensor([BY_DEPTH, [0, 0, 1, 2, 4, 1, 6, 0, 0]])
    tree = DraftTree(torch.arange(18).view(2, 9), parents, [9, 8])
    assert tree.node_depths is None
    assert tree.depths().tolist() == [BY_DEPTH_DEPTHS, [0, 1, 1, 2, 2, 3, 2, 3, 1, 1]]


def test_truncation_keeps_the_nodes_up_to_each_row_s_depth():
    tree = DraftTree(torch.arange(18).view(2, 9), torch.tensor([BY_DEPTH, BY_DEPTH]), [9, 5])
    assert tree.truncated([2, 1]).sizes == [6, 3]
    assert tree.truncated([0, 9]).sizes == [0, 5]
    assert tree.truncated([4, 3]).sizes == [9, 5]


def test_a_chain_s_q_gets_a_zero_row_for_its_last_node():
    """DraftTree.chain's q_probs is by node, [R, k+1, V]: the chain's q_i at node i − 1, then zeros."""
    q = torch.softmax(torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0)), -1)
    chain = DraftTree.chain(torch.zeros(2, 3, dtype=torch.long), [3, 2], q)
    assert chain.q_probs.shape == (2, 4, 5) and chain.sizes == [3, 2]
    assert torch.equal(chain.q_probs[:, :3], q) and not chain.q_probs[:, 3].any()
    assert chain.parents.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert chain.depths().tolist() == [[0, 1, 2, 3]] * 2


# -- growing a tree --------------------------------------------------------------------------

def _children_scores(row: int, path: tuple[int, ...], vocab: int, spread: float,
                     support: int) -> torch.Tensor:
    """Log-scores [V] of the children of `path` in row `row`: fixed by (row, path), float64, −inf past
    the row's first `support` tokens."""
    seed = 7919 * row + sum((t + 1) * (vocab + 1) ** i for i, t in enumerate(path))
    gen = torch.Generator().manual_seed(seed)
    logits = spread * torch.randn(vocab, generator=gen, dtype=torch.float64)
    logits[support:] = float("-inf")
    return torch.log_softmax(logits, -1)


def _eagle2(scores_of, topk: int, nodes: int, depth: int) -> list[tuple[float, tuple[int, ...]]]:
    """EAGLE-2 the plain way: the `topk` best children of each of the `topk` best candidates of the
    deepest depth; the `nodes` best finite candidates of all depths, as (path score, root path)."""
    def best(path):
        row = scores_of(path).tolist()
        return sorted(range(len(row)), key=lambda v: -row[v])[:topk], row

    kept = []
    frontier = [(0.0, ())]
    for _ in range(depth):
        children = []
        for s, path in frontier:
            tokens, row = best(path)
            children += [(s + row[v], path + (v,)) for v in tokens]
        kept += children
        frontier = sorted(children, key=lambda c: -c[0])[:topk]
    return [c for c in sorted(kept, key=lambda c: -c[0])[:nodes] if c[0] > float("-inf")]


def _grown(scores_of, r: int, topk: int, nodes: int, depth: int, guides=None) -> DraftTree:
    """grow_tree with children scored by their whole root path, which `expand` follows through each
    frontier node's parent index, as a drafter continuing its root path's state does."""
    paths = [[()] for _ in range(r)]  # each row's frontier, as root paths

    def expand(d, frontier, parent):
        nonlocal paths
        paths = [[paths[i][int(p)] + (int(t),) if p >= 0 else (int(t),)
                  for t, p in zip(frontier[i], parent[i], strict=True)] for i in range(r)]
        return torch.stack([torch.stack([scores_of(i, path) for path in row]) for i, row in enumerate(paths)])

    first = torch.stack([scores_of(i, ()) for i in range(r)])
    return grow_tree(first, expand, topk=topk, nodes=nodes, depth=depth, guides=guides)


def _nodes(tree: DraftTree, row: int) -> list[tuple[int, tuple[int, ...]]]:
    """(depth, root path) of each node of a row, in node order, checking that parents come first."""
    out: list[tuple[int, tuple[int, ...]]] = [(0, ())]
    for i in range(tree.sizes[row]):
        p = int(tree.parents[row, i])
        assert 0 <= p <= i
        out.append((out[p][0] + 1, out[p][1] + (int(tree.tokens[row, i]),)))
    return out[1:]


@pytest.mark.parametrize("seed", range(12))
def test_grow_tree_is_the_plain_eagle2_expansion_of_path_scores(seed):
    """Random path-dependent scores (flat to peaked, top-k up to the vocabulary, rows with a small
    support): each row's tree holds exactly the plain expansion's N best finite paths, its
    nodes numbered by depth and then best first, with the depths it records."""
    gen = torch.Generator().manual_seed(seed)
    r, vocab = 3, int(torch.randint(3, 7, (), generator=gen))
    topk = int(torch.randint(1, vocab + 1, (), generator=gen))
    nodes, depth = int(torch.randint(2, 25, (), generator=gen)), int(torch.randint(1, 6, (), generator=gen))
    spread = [0.3, 1.0, 3.0][seed % 3]
    supports = [vocab, 2, 1]

    def scores_of(row, path):
        return _children_scores(row, path, vocab, spread, supports[row])

    tree = _grown(scores_of, r, topk, nodes, depth)
    depths = tree.depths()
    for row in range(r):
        want = _eagle2(lambda path, row=row: scores_of(row, path), topk, nodes, depth)
        got = _nodes(tree, row)
        assert tree.sizes[row] == len(want)
        assert {path for _, path in got} == {path for _, path in want}, (topk, nodes, depth)
        assert depths[row, 1 : len(got) + 1].tolist() == [d for d, _ in got]
        assert depths[row, 0] == 0
        score = {path: s for s, path in want}
        keys = [(d, -score[path]) for d, path in got]
        assert keys == sorted(keys)  # by depth, then by score, best first


def test_a_tree_with_fewer_finite_candidates_than_nodes_holds_just_those():
    """A row whose support is one token has one finite path per depth: its tree is that chain,
    renumbered past the −inf candidates; the other row fills its N nodes."""
    vocab, depth = 5, 4

    def scores_of(row, path):
        return _children_scores(row, path, vocab, 1.0, [vocab, 1][row])

    tree = _grown(scores_of, 2, topk=3, nodes=8, depth=depth)
    assert tree.sizes == [8, depth]
    assert _nodes(tree, 1) == [(d, (0,) * d) for d in range(1, depth + 1)]
    assert tree.depths()[1, : depth + 1].tolist() == list(range(depth + 1))
    assert {p for _, p in _nodes(tree, 0)} == {p for _, p in _eagle2(lambda p: scores_of(0, p), 3, 8, depth)}


def test_the_tree_stops_growing_once_no_deeper_candidate_can_enter():
    """N candidates scoring at least the frontier's best: no deeper one can outrank them (a child
    never scores above its parent, and ties go to the earlier candidate), so expand is not called."""
    calls = []

    def expand(d, frontier, parent):
        calls.append(d)
        return torch.log_softmax(torch.zeros(1, 1, 4), -1)

    flat = torch.log_softmax(torch.zeros(1, 4), -1)
    tree = grow_tree(flat, expand, topk=2, nodes=2, depth=4)
    assert calls == [] and tree.sizes == [2] and tree.depths().tolist() == [[0, 1, 1]]
    # a third node: one depth more, whose best child then only ties the third best candidate
    tree = grow_tree(flat, expand, topk=2, nodes=3, depth=4)
    assert calls == [1] and tree.depths().tolist() == [[0, 1, 1, 2]]


REGEX = "(ab|cd)e;"
END = 256  # the byte tokenizer's eos


def _guide() -> GuideState:
    tokenizer = ByteTokenizer()
    compiled = GuideCompiler(tokenizer, tokenizer.vocab_size, [END]).compile(Guide("regex", REGEX))
    return GuideState(compiled, [END], tokenizer.vocab_size)


def test_guided_rows_grow_only_paths_their_guide_allows():
    """Scores that prefer tokens the regex refuses: each guided row's nodes are prefixes of the
    language, and a token the guide forces scores log 1 = 0, so with three nodes the tree is the
    better first token's forced chain; the matchers are left where they stood, and the unguided
    row beside them grows its plain tree."""
    vocab = ByteTokenizer().vocab_size
    gen = torch.Generator().manual_seed(0)
    scores = torch.log_softmax(torch.randn(3, 5, vocab, generator=gen), -1)
    scores[:, :, [ord("a"), ord("c")]] -= 3  # the guide's first tokens among the least likely
    scores[1, 0, ord("a")] += 1  # row 1 prefers a, row 0 c
    guides = [_guide(), _guide(), None]

    def grown(nodes, guides=None):
        return grow_tree(scores[:, 0], lambda d, f, _: scores[:, d, None], topk=2, nodes=nodes, depth=3,
                         guides=guides)

    tree = grown(6, guides)
    for row in (0, 1):
        assert {bytes(path) for _, path in _nodes(tree, row)} == {b"a", b"c", b"ab", b"cd", b"abe", b"cde"}
    assert _nodes(tree, 2) == _nodes(grown(6), 2)
    three = grown(3, guides)
    for row, chain in enumerate((b"cde", b"abe")):
        assert scores[row, 0, chain[0]] == scores[row, 0, [ord("a"), ord("c")]].max()
        assert [bytes(path) for _, path in _nodes(three, row)] == [chain[:1], chain[:2], chain]
    for guide in guides[:2]:  # the matchers still at the start
        assert guide.allowed_prefix(list(b"cde;")) == list(b"cde;")


# -- log-scores ------------------------------------------------------------------------------

GREEDY = SamplingParams()
HOT = SamplingParams(temperature=0.7, top_k=3)
COUPLED = SamplingParams(temperature=1.3, seed=11, coupling="gumbel")
COUPLED_CUT = SamplingParams(temperature=0.9, top_p=0.8, seed=5, coupling="gumbel")


def test_greedy_rows_score_the_log_softmax():
    logits = 4 * torch.randn(2, 3, 9, generator=torch.Generator().manual_seed(1))
    assert torch.equal(log_scores(logits, [GREEDY, GREEDY]), torch.log_softmax(logits, -1))


def test_each_row_scores_its_own_processed_law():
    """Beside sampled rows a greedy row scores its law at temperature 1; a sampled row its processed
    law (−inf outside its top-k); neither needs positions."""
    logits = 4 * torch.randn(2, 3, 9, generator=torch.Generator().manual_seed(2))
    got = log_scores(logits, [GREEDY, HOT])
    torch.testing.assert_close(got[0], torch.log_softmax(logits[0], -1))
    assert torch.equal(got[1], row_probs(logits[1:], [HOT]).log()[0])
    assert ((got[1] > float("-inf")).sum(-1) == 3).all()


def test_gumbel_coupled_rows_score_a_law_whose_best_is_their_coupled_draft():
    """A coupled row's scores at each position are a log-law (≤ 0, summing to 1) whose argmax is the
    coupled sample at that position; positions broadcast over the row's slots; rows not coupled are
    left as they were; without positions it is refused."""
    gen = torch.Generator().manual_seed(3)
    r, n, vocab = 4, 5, 11
    logits = 3 * torch.randn(r, n, vocab, generator=gen)
    params = [COUPLED, HOT, COUPLED_CUT, GREEDY]
    positions = torch.tensor([[7], [0], [30], [2]]) + torch.arange(n)  # [R, n]
    got = log_scores(logits, params, positions)
    coupled = [0, 2]
    want = coupled_choice(logits[coupled], [params[i] for i in coupled], positions[coupled])
    assert torch.equal(got[coupled].argmax(-1), want)
    torch.testing.assert_close(got[coupled].logsumexp(-1), torch.zeros(2, n), atol=1e-5, rtol=0)
    assert (got[coupled] <= 0).all()
    warm = SamplingParams(temperature=1.0)
    plain = log_scores(logits, [warm, HOT, warm, GREEDY])
    assert torch.equal(got[[1, 3]], plain[[1, 3]])
    # a frontier's nodes [R, F, V] share their row's position: positions [R, 1] broadcast
    frontier = log_scores(logits[:, :3], params, positions[:, :1])
    at = positions[coupled, :1].expand(2, 3)
    want = coupled_choice(logits[coupled, :3], [COUPLED, COUPLED_CUT], at)
    assert torch.equal(frontier[coupled].argmax(-1), want)
    with pytest.raises(ValueError, match="positions"):
        log_scores(logits, params)


# -- the verifiers ---------------------------------------------------------------------------

def test_a_verdict_s_row_is_its_accepted_tokens_then_the_last():
    """TreeVerdict.row(r): the a accepted drafts of row r, then its recovered/bonus token."""
    tokens = torch.tensor([[1, 2, 3], [1, 2, 3]])
    parents = torch.tensor([[0, 1, 2], [0, 1, 2]])
    choice = torch.tensor([[1, 2, 0, 0], [1, 2, 3, 4]])  # row 0 stops at node 2, row 1 takes the chain
    verdict = verify_tree_chosen(tokens, parents, [3, 3], choice)
    assert verdict.row(0) == [1, 2, 0] and verdict.row(1) == [1, 2, 3, 4]


# p_root over 4 tokens, none on token 0: float32 values whose float64 sum falls short of 1, so that
# uniforms just below 1 reject all three children (found by search)
SHORT = torch.tensor([0.0, 0.34844428300857544, 0.538161039352417, 0.11339462548494339])
JUST_BELOW_1 = float(torch.tensor(1.0).nextafter(torch.tensor(0.0)))


def test_rounding_that_rejects_all_of_p_draws_the_last_token_from_p():
    """Children covering p's whole support, each rejected only through float rounding: the last token
    is drawn from p itself, never a token p rules out."""
    tokens, parents = torch.tensor([[1, 2, 3]]), torch.tensor([[0, 0, 0]])
    p = SHORT.expand(1, 4, 4)
    uniforms = torch.full((1, 3), JUST_BELOW_1)
    out = verify_tree_sampling(tokens, parents, [3], p, uniforms, torch.tensor([0.5]))
    assert out.num_accepted.tolist() == [0] and out.row(0) == [2]  # p's cdf passes 0.5 at token 2


def test_a_draft_p_rules_out_is_rejected_even_at_a_uniform_of_0():
    """torch.rand can return 0: a child whose token p gives 0 is still never accepted (the accept
    test is u · mass < r(x), strictly), under both rules; the next child with mass is."""
    tokens, parents = torch.tensor([[0, 1]]), torch.tensor([[0, 0]])
    p = SHORT.expand(1, 3, 4)
    q = torch.tensor([0.5, 0.1, 0.4, 0.0]).expand(1, 3, 4)
    zeros = torch.zeros(1, 2)
    for q_probs in (None, q):
        out = verify_tree_sampling(tokens, parents, [2], p, zeros, torch.tensor([0.0]), q_probs)
        assert out.path[0, 0] == 2 and out.num_accepted.tolist() == [1], q_probs
