"""Draft trees: tree attention and path commit in the slot buffers, the tree verification rules
(greedy; sampling with deterministic or sampled children) and tree decoding with every drafter:
token-identical to the target alone under greedy, the target's law under sampling."""

from __future__ import annotations

import copy

import pytest
import torch

from trtspec.config import ScheduleConfig, TreeConfig, load_build_config
from trtspec.errors import ConfigError
from trtspec.models.target import Chunk, PathKeep
from trtspec.pipeline import load_pipeline
from trtspec.prompts import load_prompts
from trtspec.spec.decoder import Request
from trtspec.spec.sampling import SamplingParams
from trtspec.spec.tree import DraftTree, grow_tree
from trtspec.spec.tree_verify import verify_tree_greedy, verify_tree_sampling
from trtspec.spec.verify import draw_uniforms, verify_greedy, verify_sampling
from trtspec.triton.verify import tv_bound

from .conftest import REPO, assert_samples_follow_target

# 16 held-out prompts: 6 code, 6 math, 4 chat
PROMPTS = (load_prompts("code")[:12] + load_prompts("math")[:12] + load_prompts("chat")[:8])[::2]
TREE = TreeConfig(nodes=12, topk=3)
FULL = ScheduleConfig(mode="full")
DRAWS = 40_000


def _config(name: str, flavour: str = "torch"):
    return load_build_config(REPO / "build_configs" / f"{name}.yaml").model_copy(update={"flavour": flavour})


@pytest.fixture(scope="module", params=["torch", "engine"])
def target(request):
    """The torch target (per-slot buffers) and the engine one (the exported graph under onnxruntime)."""
    return load_pipeline(_config("tiny-dflash", request.param), use_drafter=False).target


# -- tree attention and commit ---------------------------------------------------------------

def _root_path(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


PARENTS = [-1, 0, 0, 1, 2, 4, 1, 6, 0]  # root, then nodes; several children per node, depth 4


def test_tree_nodes_see_their_root_path_only(target):
    """Every node of a tree fed in one forward (beside another request's prefill) gets the logits
    of its root path fed alone as a chain."""
    t = copy.copy(target)
    t.allocate(3, 128)
    prompt = torch.tensor(list(b"def area(r):\n    return"))
    ids = torch.cat([prompt[-1:], torch.tensor([32, 51, 3, 40, 41, 42, 10, 120])])
    t.forward([Chunk(0, prompt[:-1]), Chunk(1, prompt[:-1])])
    out = t.forward([Chunk(2, prompt), Chunk(0, ids, tuple(PARENTS))])
    assert t.seq_len(0) == len(prompt) + len(PARENTS) - 1
    for node in range(len(PARENTS)):
        path = _root_path(PARENTS, node)
        t.rewind(1, t.seq_len(1) - len(prompt) + 1)
        ref = t.forward([Chunk(1, ids[path])])
        torch.testing.assert_close(out.logits[len(prompt) + node], ref.logits[-1], atol=1e-4, rtol=1e-4)


def test_committing_a_non_contiguous_path_equals_feeding_it(target):
    """After keeping the path root → 2 → 4 → 5 of a tree (storage indices 0, 2, 4, 5 of the tree,
    RoPE positions 0..3), the slot's K/V equal those of the accepted tokens fed alone; the other
    request's slot is untouched and the next forward continues from the path."""
    t = copy.copy(target)
    t.allocate(3, 128)
    prompt = torch.tensor(list(b"for i in range(10):"))
    ids = torch.cat([prompt[-1:], torch.tensor([32, 51, 3, 40, 41, 42, 10, 120])])
    t.forward([Chunk(0, prompt[:-1]), Chunk(1, prompt[:-1]), Chunk(2, prompt)])
    t.forward([Chunk(0, ids, tuple(PARENTS)), Chunk(2, ids[:3])])
    t.rewind(2, 3)
    path = [0, 2, 4, 5]
    t.keep_paths([PathKeep(0, len(prompt) - 1, path)])
    t.forward([Chunk(1, ids[path])])
    n = len(prompt) - 1 + len(path)
    assert t.seq_len(0) == t.seq_len(1) == n
    nxt = torch.tensor([65, 66])
    a, b, c = (t.forward([Chunk(s, nxt)]).logits for s in range(3))
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    fresh = copy.copy(target)  # slot 2 was not touched by the move: as if fed alone
    fresh.allocate(1, 128)
    fresh.forward([Chunk(0, prompt)])
    torch.testing.assert_close(c, fresh.forward([Chunk(0, nxt)]).logits, atol=1e-4, rtol=1e-4)
    if hasattr(t, "cache"):  # torch: the buffers themselves (the engine keeps one packed cache)
        for layer in t.cache.layers:
            torch.testing.assert_close(layer.keys[0, :, :n], layer.keys[1, :, :n], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(layer.values[0, :, :n], layer.values[1, :, :n], atol=1e-5, rtol=1e-5)


# -- growing a tree --------------------------------------------------------------------------

def _eagle2_paths(scores: list[list[float]], topk: int, nodes: int, depth: int) -> set[tuple[int, ...]]:
    """EAGLE-2 the plain way, for children scored by depth only (scores [depth][V]): each depth's
    `topk` best candidates are expanded by their `topk` best children; the `nodes` best finite
    candidates of all depths are kept, as root paths of tokens."""
    def best(row):
        return sorted(range(len(row)), key=lambda v: -row[v])[:topk]

    frontier = [(scores[0][v], (v,)) for v in best(scores[0])]
    candidates = list(frontier)
    for d in range(1, depth):
        children = [(s + scores[d][v], path + (v,)) for s, path in frontier for v in best(scores[d])]
        candidates += children
        frontier = sorted(children, key=lambda c: -c[0])[:topk]
    kept = sorted(candidates, key=lambda c: -c[0])[:nodes]
    return {path for s, path in kept if s > float("-inf")}


def _paths(tree: DraftTree, row: int) -> set[tuple[int, ...]]:
    parents = tree.row_parents(row)
    tokens = [None, *tree.tokens[row, : tree.sizes[row]].tolist()]
    return {tuple(tokens[u] for u in _root_path(list(parents), node)[1:]) for node in range(1, len(tokens))}


def test_grow_tree_ranks_paths_and_orders_parents_first():
    """EAGLE-2's expansion over per-slot marginals: N nodes, each after its parent, by depth; the
    greedy chain is in the tree; a child never scores above its parent; rows are independent;
    tokens outside a row's support (−inf) are never proposed."""
    gen = torch.Generator().manual_seed(0)
    r, depth, vocab = 3, 5, 20
    scores = torch.log_softmax(6 * torch.randn(r, depth, vocab, generator=gen), -1)
    scores[2, :, 2:] = float("-inf")  # row 2 has two tokens per slot
    tree = grow_tree(scores[:, 0], lambda d, f, _: scores[:, d, None], topk=3, nodes=10, depth=depth)
    assert tree.sizes[:2] == [10, 10] and tree.sizes[2] <= 10
    depths = tree.depths()
    for row in range(r):
        n = tree.sizes[row]
        parents = tree.parents[row, :n].tolist()
        assert all(p <= i for i, p in enumerate(parents))  # node i + 1's parent is 0..i
        assert depths[row, 1 : n + 1].tolist() == sorted(depths[row, 1 : n + 1].tolist())
        path_score = [0.0]
        for i in range(n):
            d = int(depths[row, i + 1])
            s = path_score[parents[i]] + float(scores[row, d - 1, tree.tokens[row, i]])
            assert s <= path_score[parents[i]] + 1e-6 and s > float("-inf")
            path_score.append(s)
        u = 0
        for d in range(2):  # the greedy chain's first two nodes
            kids = {int(tree.tokens[row, i]): i + 1 for i in range(n) if parents[i] == u}
            assert int(scores[row, d].argmax()) in kids
            u = kids[int(scores[row, d].argmax())]
    assert set(tree.tokens[2, : tree.sizes[2]].tolist()) <= {0, 1}
    for row in range(r):  # the paths kept are the plain EAGLE-2 expansion's N best
        assert _paths(tree, row) == _eagle2_paths(scores[row].tolist(), topk=3, nodes=10, depth=depth)
    cut = tree.truncated([1, 2, 0])
    assert cut.sizes[2] == 0 and all(int(depths[0, i + 1]) <= 1 for i in range(cut.sizes[0]))


# -- the rules -------------------------------------------------------------------------------

V = 6
P_ROOT = torch.tensor([0.30, 0.25, 0.20, 0.10, 0.10, 0.05])
# root children 1, 0, 1 (a repeat), 4; node 1 (token 1) has children 2, 3; node 2 (token 0) child 5
HAND_TOKENS = torch.tensor([1, 0, 1, 4, 2, 3, 5])
HAND_PARENTS = torch.tensor([0, 0, 0, 0, 1, 1, 2])
P_NODES = torch.tensor([
    [0.30, 0.25, 0.20, 0.10, 0.10, 0.05],  # root
    [0.05, 0.05, 0.40, 0.30, 0.10, 0.10],  # node 1 (…, 1)
    [0.10, 0.10, 0.10, 0.10, 0.10, 0.50],  # node 2 (…, 0)
    [0.05, 0.05, 0.40, 0.30, 0.10, 0.10],  # node 3 (…, 1) same prefix as node 1
    [1 / 6] * 6,  # node 4 (…, 4)
    [0.20, 0.20, 0.20, 0.20, 0.10, 0.10],  # node 5 (…, 1, 2)
    [0.50, 0.10, 0.10, 0.10, 0.10, 0.10],  # node 6 (…, 1, 3)
    [0.25, 0.25, 0.25, 0.25, 0.00, 0.00],  # node 7 (…, 0, 5)
])


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a - b).abs().sum().item()


def _emitted(rule, seed: int, q_probs=None, tokens=HAND_TOKENS, parents=HAND_PARENTS):
    gen = torch.Generator().manual_seed(seed)
    n = tokens.shape[-1]
    toks = tokens.expand(DRAWS, n) if tokens.dim() == 1 else tokens
    pars = parents.expand(DRAWS, n)
    p = P_NODES.expand(DRAWS, n + 1, V)
    uniforms, u_last = draw_uniforms(DRAWS, n, gen)
    return rule(toks, pars, [n] * DRAWS, p, uniforms, u_last, q_probs)


def _check_law(out) -> list[tuple[float, float]]:
    """(TV, bound) of the first emitted token against p_root, and of the second against p_node given
    that the root's child `node` was accepted; bounds hold with probability 1 − 1e-3 each."""
    law = torch.bincount(out.tokens[:, 0], minlength=V).float() / DRAWS
    checks = [(tv(law, P_ROOT), tv_bound(V, DRAWS, 1e-3))]
    for node in (1, 2, 4):
        got = out.tokens[out.path[:, 0] == node, 1]
        if len(got) > 1000:
            checks.append((tv(torch.bincount(got, minlength=V).float() / len(got), P_NODES[node]),
                           tv_bound(V, len(got), 1e-3)))
    return checks


def test_deterministic_children_reproduce_the_target():
    """Several children per node, a repeated token, children whose tokens the residual keeps
    mass around: the first token has law p_root and the next one, after an accepted child, that
    child's p."""
    out = _emitted(verify_tree_sampling, seed=1)
    checks = _check_law(out)
    assert len(checks) == 4 and all(d < bound for d, bound in checks), checks
    assert (out.path[:, 0] == 3).sum() == 0  # the repeated token is never accepted twice


def _without_renormalising(tokens, parents, sizes, p, uniforms, u_last, q=None):
    """A broken rule: accept child x with probability r(x), not r(x) / Σr after the rejections before
    it — the real rule fed u / Σr, whose test u · Σr < r(x) then reads u < r(x)."""
    mass, gone = [], {}
    for parent, x in zip(HAND_PARENTS.tolist(), HAND_TOKENS.tolist(), strict=True):
        rejected = gone.setdefault(parent, {})
        mass.append(1.0 - sum(rejected.values()))
        rejected.setdefault(x, float(P_NODES[parent, x]))
    return verify_tree_sampling(tokens, parents, sizes, p, uniforms / torch.tensor(mass), u_last)


def test_a_rule_that_does_not_renormalise_is_caught():
    d, bound = _check_law(_emitted(_without_renormalising, seed=2))[0]
    assert d > 5 * bound, (d, bound)


def test_children_sampled_without_replacement_reproduce_the_target():
    """Recursive rejection sampling: each node's children drawn from its q without replacement."""
    gen = torch.Generator().manual_seed(3)
    q = torch.softmax(torch.randn(len(P_NODES), V, generator=gen), -1)
    q[0] = torch.tensor([0.05, 0.35, 0.30, 0.05, 0.20, 0.05])  # root children share p's support
    tokens = torch.empty(DRAWS, len(HAND_TOKENS), dtype=torch.long)
    # children of node u drawn from q_u without replacement (Gumbel top-k), in the draw order
    for u in range(len(P_NODES)):
        kids = [i for i, p in enumerate(HAND_PARENTS.tolist()) if p == u]
        if kids:
            keys = q[u].log() - torch.log(-torch.log(torch.rand(DRAWS, V, generator=gen)))
            tokens[:, kids] = keys.topk(len(kids), -1).indices
    out = _emitted(verify_tree_sampling, seed=4, q_probs=q.expand(DRAWS, *q.shape), tokens=tokens)
    checks = _check_law(out)
    assert len(checks) >= 3 and all(d < bound for d, bound in checks), checks


def test_a_chain_is_a_tree():
    """A chain given as a tree gets the chain verifier's verdict: greedy, and sampling with its q
    (one child drawn from q per node is speculative sampling itself), same randomness."""
    gen = torch.Generator().manual_seed(5)
    r, k, vocab = 64, 4, 8
    logits = 2 * torch.randn(r, k + 1, vocab, generator=gen)
    draft = logits.argmax(-1)[:, :k].clone()
    draft[::3, 1] = (draft[::3, 1] + 1) % vocab
    chain = DraftTree.chain(draft)
    tree = verify_tree_greedy(chain.tokens, chain.parents, chain.sizes, logits)
    ref = verify_greedy(draft, logits)
    assert torch.equal(tree.num_accepted, ref.num_accepted) and torch.equal(tree.tokens, ref.tokens)
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits[:, :k] + torch.randn(r, k, vocab, generator=gen), -1)
    draft = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).view(r, k)
    uniforms, u_last = draw_uniforms(r, k, gen)
    ref = verify_sampling(draft, q, p, uniforms, u_last)
    chain = DraftTree.chain(draft, q_probs=q)  # the chain's q [R, k, V], as every drafter returns it
    got = verify_tree_sampling(draft, chain.parents, chain.sizes, p, uniforms, u_last, chain.q_probs)
    assert torch.equal(got.num_accepted, ref.num_accepted) and torch.equal(got.tokens, ref.tokens)
    assert (ref.num_accepted == k).any()  # whole chains accepted: the last node's (empty) q is read too


# -- tree decoding ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def alone():
    decoder = load_pipeline(_config("tiny-dflash"), use_drafter=False).decoder_for(1, FULL)
    return [decoder.generate(list(p.encode()), 32).token_ids for p in PROMPTS]


@pytest.mark.parametrize("name", ["tiny-dflash", "tiny-dspark", "tiny-eagle3", "tiny-draft-model"])
def test_tree_greedy_identical_to_target_alone(name, alone):
    """16 held-out prompts at R = 1 and R = 4: every drafter's trees give the target's tokens."""
    pipeline = load_pipeline(_config(name))
    reqs = [Request(list(p.encode()), 32) for p in PROMPTS]
    for slots in (1, 4):
        decoder = pipeline.decoder_for(slots, FULL, tree=TREE)
        got = decoder.generate_batch(reqs)
        assert [r.token_ids for r in got] == alone
        tokens = sum(len(r.token_ids) for r in got)
        assert decoder.offered_drafts > decoder.num_cycles  # trees, not chains of one
        assert tokens / sum(r.num_target_calls for r in got) > 1.5


@pytest.mark.parametrize("name", ["tiny-dflash", "tiny-dspark"])
def test_engine_tree_greedy_identical_to_target_alone(name, alone):
    """The engine flavour (exported graphs, tree verification graph, onnxruntime) at R = 1 and 4."""
    pipeline = load_pipeline(_config(name, "engine"))
    reqs = [Request(list(p.encode()), 32) for p in PROMPTS[::2]]
    for slots in (1, 4):
        got = pipeline.decoder_for(slots, FULL, tree=TREE).generate_batch(reqs)
        assert [r.token_ids for r in got] == alone[::2]


def test_engine_tree_verify_graphs_equal_the_torch_rules():
    """`confidence_verify_tree_{greedy,sampling}` under onnxruntime give the torch rules' verdicts
    token for token: grown trees (ragged sizes) and the hand-built one (a repeated sibling token)."""
    from trtspec.engine.ort import OrtSession
    from trtspec.engine.verify import GraphVerifier
    from trtspec.export.verify import export_verify_tree_greedy, export_verify_tree_sampling

    gen = torch.Generator().manual_seed(7)
    r, vocab = 6, 12
    scores = torch.log_softmax(2 * torch.randn(r, 5, vocab, generator=gen), -1)
    grown = grow_tree(scores[:, 0], lambda d, f, _: scores[:, d, None], topk=3, nodes=10, depth=5)
    grown.sizes[1], grown.sizes[4] = 4, 0
    hand = DraftTree(HAND_TOKENS.expand(r, -1), HAND_PARENTS.expand(r, -1), [7] * r)
    graphs = GraphVerifier(None, None, OrtSession(export_verify_tree_greedy(vocab)),
                           OrtSession(export_verify_tree_sampling(vocab)))
    for tree in (grown, hand):
        n = tree.width
        for _ in range(10):
            logits = 3 * torch.randn(r, n + 1, vocab, generator=gen)
            hit = torch.rand(r, n, generator=gen) < 0.6  # make the drafts the argmax often
            rows = torch.arange(r)[:, None].expand(r, n)
            logits[rows[hit], tree.parents[hit], tree.tokens[hit]] += 10
            want = verify_tree_greedy(tree.tokens, tree.parents, tree.sizes, logits)
            got = graphs.tree_greedy(tree.tokens, tree.parents, tree.sizes, logits)
            for name in ("num_accepted", "path", "tokens"):
                assert torch.equal(getattr(got, name), getattr(want, name)), name
            p = torch.softmax(logits / 3, -1)
            uniforms, u_last = draw_uniforms(r, n, gen)
            want = verify_tree_sampling(tree.tokens, tree.parents, tree.sizes, p, uniforms, u_last)
            got = graphs.tree_sampling(tree.tokens, tree.parents, tree.sizes, p, uniforms, u_last)
            for name in ("num_accepted", "path", "tokens"):
                assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_tree_sampling_follows_target():
    """R = 16 sampling requests decoded with DFlash trees: the first four tokens have the target's law."""
    pipeline = load_pipeline(_config("tiny-dflash"))
    decoder = pipeline.decoder_for(16, FULL, tree=TreeConfig(nodes=8, topk=2))
    # a spread law (top tokens 0.91, 0.91, 0.41, 0.43; on "Q: 12 + 34\nA:" 0.9999, which a biased
    # rule passes too)
    assert_samples_follow_target(pipeline.target.model, decoder, list(b"    def __init__(self"),
                                 SamplingParams(temperature=1.0, top_k=3), steps=4)


def test_end_id_and_min_tokens_with_trees():
    """A request's own end id stops it inside an accepted path; min_new_tokens removes the end id
    from p at every node whose token would come too early."""
    pipeline = load_pipeline(_config("tiny-dflash"))
    decoder = pipeline.decoder_for(2, FULL, tree=TREE)
    prompt, newline = list(b"Q: 482 + 356\nA:"), ord("\n")
    full = decoder.generate_batch([Request(prompt, 60)])[0].token_ids
    cut = decoder.generate_batch([Request(prompt, 60, end_id=newline)])[0].token_ids
    m = full.index(newline)
    assert cut == full[: m + 1]
    longer = decoder.generate_batch([Request(prompt, 60, min_new_tokens=m + 3, end_id=newline)])[0]
    assert longer.token_ids[:m] == full[:m] and newline not in longer.token_ids[: m + 3]
    with torch.no_grad():
        logits = pipeline.target.model(torch.tensor([prompt + full[:m]])).logits[0, -1]
    logits[newline] = float("-inf")
    assert longer.token_ids[m] == int(logits.argmax())


def test_caches_after_tree_steps_equal_caches_of_the_accepted_tokens():
    """Target and draft-model caches after tree steps (accepted paths moved into place) equal a
    fresh prefill of the committed tokens."""
    pipeline = load_pipeline(_config("tiny-draft-model"))
    decoder = pipeline.decoder_for(2, FULL, tree=TREE)
    ids = [decoder.add(Request(list(p.encode()), 40)) for p in PROMPTS[:2]]
    for _ in range(4):
        decoder.step()
    lives = [decoder.lives[i] for i in ids if i in decoder.lives]
    fresh = copy.copy(pipeline.target)
    fresh.allocate(1, 512)
    lm = decoder.drafter.lm
    for lv in lives:
        committed = lv.request.prompt + lv.generated[:-1]
        n = len(committed)
        assert decoder.target.seq_len(lv.slot) == n
        fresh.reset()
        fresh.forward([Chunk(0, torch.tensor(committed))])
        for a, b in zip(decoder.target.cache.layers, fresh.cache.layers, strict=True):
            torch.testing.assert_close(a.keys[lv.slot, :, :n], b.keys[0, :, :n], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(a.values[lv.slot, :, :n], b.values[0, :, :n], atol=1e-4, rtol=1e-4)
        # the draft model kept its accepted nodes' K/V: what it holds equals its own prefill
        decoder.drafter._keep_committed_path(type("Row", (), {"slot": lv.slot, "committed": lv.committed})())
        held = decoder.drafter.fed[lv.slot]
        assert held == lv.committed[: len(held)] and len(held) > len(lv.request.prompt)
        ref = copy.copy(lm)
        ref.allocate(1, 512)
        ref.forward([Chunk(0, torch.tensor(held))])
        for a, b in zip(lm.cache.layers, ref.cache.layers, strict=True):
            torch.testing.assert_close(a.keys[lv.slot, :, : len(held)], b.keys[0, :, : len(held)],
                                       atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tree,message", [
    ("{nodes: 0}", r"field `drafter.tree.nodes`: Input should be greater than or equal to 1"),
    ("{nodes: 8, width: 2}", r"field `drafter.tree.width`: Extra inputs are not permitted"),
    ("{nodes: 8}\n  schedule: {mode: scheduler}", "drafter.tree works with schedule.mode adaptive or full"),
])
def test_tree_config_is_checked(tmp_path, tree, message):
    text = (REPO / "build_configs" / "tiny-dflash.yaml").read_text()
    path = tmp_path / "tree.yaml"
    path.write_text(text.replace("limits:", f"  tree: {tree}\nlimits:"))
    with pytest.raises(ConfigError, match=message):
        load_build_config(path)


def test_tree_budget_and_admission_follow_the_cost_table():
    """tree_budget: the most nodes verified within 1.1 × the chain's forward (flat on a GPU-like
    table); tree_rows: the requests whose expected gain pays, none when drafting costs too much."""
    from trtspec.spec.cost import tree_budget, tree_rows
    from trtspec.spec.schedule import SPSTable

    cpu = SPSTable(batch_tokens=[1, 16, 32, 64], steps_per_s=[100.0, 100.0, 80.0, 40.0],
                   draft_batches=[1, 8], draft_lens=[15], draft_seconds=[[0.002], [0.003]])
    assert tree_budget(cpu, 15) == 22  # SPS(N + 1) >= 100 / 1.1 up to B = 23
    gpu = cpu.model_copy(update={"batch_tokens": [1, 512], "steps_per_s": [100.0, 100.0]})
    assert tree_budget(gpu, 15) == 256
    assert tree_rows(cpu, [5.0, 1.0, 4.0], 3, 22, 15, per_depth_forward=False, topk=4) == [0, 2]
    assert tree_rows(cpu, [3.0, 1.0, 2.5], 3, 22, 15, per_depth_forward=False, topk=4) == [0]
    slow = cpu.model_copy(update={"draft_seconds": [[0.5], [0.5]]})
    assert tree_rows(slow, [3.0, 2.5], 2, 22, 15, per_depth_forward=False, topk=4) == []
    # a request whose drafter must first catch up 20 ms gives way; so does the step, past 40 ms
    assert tree_rows(cpu, [5.0, 1.0, 4.0], 3, 22, 15, per_depth_forward=False, topk=4,
                     catch_up=[0.0, 0.0, 0.02]) == [0]
    assert tree_rows(cpu, [5.0, 1.0, 4.0], 3, 22, 15, per_depth_forward=False, topk=4,
                     catch_up=[0.04, 0.0, 0.04]) == []


def test_a_tree_request_filling_the_whole_context_decodes_as_the_target_alone():
    """A prompt and max_tokens that fill the target's context to its last position: an EAGLE-3 tree
    (12 nodes, top-3, depth 7) still has room for its nodes and each depth's frontier (3 * 7 written
    after the committed tokens) at the very end, and the answer is the target alone's."""
    pipeline = load_pipeline(_config("tiny-eagle3"))
    decoder = pipeline.decoder_for(1, FULL, tree=TreeConfig(nodes=12, topk=3))
    assert decoder.num_draft_tokens == 7
    max_tokens = 40
    prompt = list("".join(load_prompts("code") * 20).encode())[: decoder.capacity - max_tokens]
    got = decoder.generate_batch([Request(prompt, max_tokens)])[0]
    alone = pipeline.decoder_for(1, FULL, use_drafter=False).generate_batch([Request(prompt, max_tokens)])[0]
    assert len(got.token_ids) == max_tokens and got.token_ids == alone.token_ids
