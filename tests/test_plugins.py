"""Plugin kernels (plugins/) against their torch references, on CPU under the Triton interpreter.

TRITON_INTERPRET must be set before `@triton.jit` runs, for triton.language's own library too
(tl.sum, tl.zeros are jit functions). conftest's transformers import already loads triton, so
unless pytest was started with TRITON_INTERPRET=1 this module drops triton's Python modules (not
its C extension) and imports them again with the interpreter on; nothing else in the test suite
uses Triton. Outputs are poisoned first (NaN / a sentinel) so an element the kernel fails to write
fails the comparison. bfloat16 attention runs its tl.dot on float32 operands in the interpreter,
whose bfloat16 dot multiplies bit patterns (triton-lang/triton#11584); the native bfloat16 MMA is
checked on a GPU by `scripts/gpu_check.sh`.
"""

from __future__ import annotations

import os
import sys


def _reimport_triton_interpreted() -> None:
    standard = sys.modules.get("triton.language.standard")
    if standard is None or type(standard.zeros).__name__ == "InterpretedFunction":
        return
    for name in [m for m in sys.modules if m.split(".")[0] in ("triton", "plugins")]:
        if not name.startswith("triton._C"):  # the compiled extension cannot be imported twice
            del sys.modules[name]


os.environ["TRITON_INTERPRET"] = "1"
_reimport_triton_interpreted()

import re  # noqa: E402
import subprocess  # noqa: E402
import textwrap  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from plugins._common import interpreter_problem  # noqa: E402
from plugins.confidence_verify import (  # noqa: E402
    draw_uniforms,
    inverse_cdf,
    verify_greedy,
    verify_sampling,
    verify_sampling_explicit,
    verify_tree_greedy,
    verify_tree_sampling,
)
from plugins.coupled_argmax import coupled_argmax  # noqa: E402
from plugins.kv_injection_attention import (  # noqa: E402
    kv_injection_attention,
    kv_injection_attention_concat,
    kv_injection_attention_reference,
)
from trtspec.errors import TrtspecError  # noqa: E402
from trtspec.models import dflash  # noqa: E402
from trtspec.spec import tree_verify  # noqa: E402
from trtspec.spec import verify as torch_verify  # noqa: E402
from trtspec.spec.coupling import noise_of_keys, row_keys  # noqa: E402
from trtspec.spec.tree import DraftTree, grow_tree  # noqa: E402
from trtspec.spec.verify import PAD  # noqa: E402


def _attention_inputs(b, h, kvh, block, c, d, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(b, h, block, d), (b, kvh, c, d), (b, kvh, c, d), (b, kvh, block, d), (b, kvh, block, d)]
    return [torch.randn(*s, generator=gen).to(dtype) for s in shapes]


def _run_attention(args, **kw) -> torch.Tensor:
    out = torch.full_like(args[0], float("nan"))
    kv_injection_attention(*args, out=out, **kw)
    return out


# -- kv_injection_attention ----------------------------------------------------------------------

ATTENTION_CASES = [  # (b, h, kvh, B, c, d): GQA ratios 1/2/4, blocks 2/7/16, contexts 0/1/37/300
    (1, 2, 2, 2, 0, 16),
    (2, 4, 2, 7, 1, 32),
    (2, 8, 2, 16, 37, 16),
    (1, 4, 1, 7, 300, 32),
    (1, 2, 1, 16, 1, 64),
    (1, 2, 2, 2, 37, 128),
]


@pytest.mark.parametrize("b,h,kvh,block,c,d", ATTENTION_CASES)
def test_attention_matches_reference_fp32(b, h, kvh, block, c, d):
    args = _attention_inputs(b, h, kvh, block, c, d, seed=c + block)
    got = _run_attention(args)
    want = kv_injection_attention_reference(*args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_attention_tiles_and_row_blocks():
    # several K/V tiles per part and several programs per kv head: BLOCK_N, BLOCK_M < the extents
    args = _attention_inputs(1, 8, 2, 16, 300, 32, seed=3)
    got = _run_attention(args, block_m=16, block_n=16)
    torch.testing.assert_close(got, kv_injection_attention_reference(*args), rtol=1e-5, atol=1e-5)


def test_attention_per_row_context_lengths():
    args = _attention_inputs(3, 4, 2, 7, 37, 16, seed=4)
    ctx_lens = torch.tensor([0, 20, 37])  # a static cache of width 37, rows filled to different depths
    got = _run_attention(args, ctx_lens=ctx_lens)
    torch.testing.assert_close(got, kv_injection_attention_reference(*args, ctx_lens=ctx_lens),
                               rtol=1e-5, atol=1e-5)
    # row 1 must ignore whatever lies past its 20 context rows
    poked = [t.clone() for t in args]
    poked[1][1, :, 20:] = 1e4
    poked[2][1, :, 20:] = -1e4
    torch.testing.assert_close(_run_attention(poked, ctx_lens=ctx_lens), got, rtol=0, atol=0)


def test_attention_concat_form_equals_drafter_reference():
    q, ck, cv, bk, bv = _attention_inputs(2, 4, 2, 7, 37, 32, seed=5)
    k, v = torch.cat([ck, bk], 2), torch.cat([cv, bv], 2)
    torch.testing.assert_close(kv_injection_attention_concat(q, k, v), dflash.kv_injection_attention(q, k, v),
                               rtol=1e-5, atol=1e-5)


def test_attention_takes_projection_layout():
    # project_kv's `.view(b, s, kvh, d).transpose(1, 2)`: strided K/V are made contiguous, not misread
    q, ck, cv, bk, bv = _attention_inputs(2, 4, 2, 7, 37, 16, seed=8)
    strided = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (ck, cv, bk, bv)]
    assert not strided[0].is_contiguous()
    want = kv_injection_attention_reference(q, ck, cv, bk, bv)
    torch.testing.assert_close(_run_attention([q, *strided]), want, rtol=1e-5, atol=1e-5)


def test_attention_reads_one_kv_head_and_k_v_of_different_layouts():
    """One kv head (multi-query attention) in the projection layout: the size-1 head dimension's
    stride is d, not the batch's; and context K a view into a wider cache beside a contiguous V:
    each read at its own layout, not K's stride for both."""
    q, ck, cv, bk, bv = _attention_inputs(3, 4, 1, 7, 37, 16, seed=9)
    # project_kv's `.view(b, s, kvh, d).transpose(1, 2)` of a fresh [b, s, 1, d] projection
    projected = [torch.empty(t.transpose(1, 2).shape).copy_(t.transpose(1, 2)).transpose(1, 2)
                 for t in (ck, cv, bk, bv)]
    assert projected[0].stride(1) == 16 and projected[0].stride(0) == 37 * 16
    want = kv_injection_attention_reference(q, ck, cv, bk, bv)
    torch.testing.assert_close(_run_attention([q, *projected]), want, rtol=1e-5, atol=1e-5)
    q, ck, cv, bk, bv = _attention_inputs(2, 4, 2, 7, 37, 16, seed=10)
    cache = torch.zeros(2, 2, 64, 16)
    cache[:, :, :37] = ck
    want = kv_injection_attention_reference(q, ck, cv, bk, bv)
    torch.testing.assert_close(_run_attention([q, cache[:, :, :37], cv, bk, bv]), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("b,h,kvh,block,c,d", [ATTENTION_CASES[2], ATTENTION_CASES[3]])
def test_attention_half_precision(dtype, tol, b, h, kvh, block, c, d):
    args = _attention_inputs(b, h, kvh, block, c, d, seed=6, dtype=dtype)
    got = _run_attention(args)
    assert got.dtype == dtype and not got.isnan().any()
    want = kv_injection_attention_reference(*(t.float() for t in args))
    assert ((got.float() - want).norm() / want.norm()).item() < tol


def test_attention_refuses_bad_input(monkeypatch):
    q, ck, cv, bk, bv = _attention_inputs(1, 3, 2, 4, 5, 16, seed=0)
    with pytest.raises(TrtspecError, match="multiple of num_kv_heads"):
        kv_injection_attention(q, ck, cv, bk, bv)
    q, ck, cv, bk, bv = _attention_inputs(1, 4, 2, 4, 5, 16, seed=0)
    with pytest.raises(TrtspecError, match="does not fit"):
        kv_injection_attention(q, ck, cv, bk[:, :, :3], bv[:, :, :3])
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(TrtspecError, match="TRITON_INTERPRET=1"):
        kv_injection_attention(q, ck, cv, bk, bv)


# -- confidence_verify: greedy -------------------------------------------------------------------

def _poisoned(b: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((b,), -7, dtype=torch.long), torch.full((b, k + 1), -7, dtype=torch.long)


def _greedy_case(b, k, vocab, seed, ties=False):
    gen = torch.Generator().manual_seed(seed)
    if ties:  # few distinct values: many tied maxima, the first index must win as in torch.argmax
        logits = torch.randint(0, 4, (b, k + 1, vocab), generator=gen).float()
    else:
        logits = torch.randn(b, k + 1, vocab, generator=gen)
    draft = logits.argmax(-1)[:, :k].clone()
    flip = torch.rand(b, k, generator=gen) < 0.2
    draft[flip] = (draft[flip] + 1) % vocab
    lens = torch.randint(0, k + 1, (b,), generator=gen)
    return draft, logits, lens


@pytest.mark.parametrize("b,k,vocab,block_v,ties", [
    (6, 2, 20, None, False), (8, 7, 300, 64, False), (5, 15, 50, 16, True), (4, 16, 33, 16, True),
])
@pytest.mark.parametrize("with_lens", [False, True])
def test_greedy_kernel_equals_reference(b, k, vocab, block_v, ties, with_lens):
    draft, logits, lens = _greedy_case(b, k, vocab, seed=b * k, ties=ties)
    lens = lens if with_lens else None
    out = _poisoned(b, k)
    got = verify_greedy(draft, logits, lens, block_v=block_v, out=out)
    want = torch_verify.verify_greedy(draft, logits, lens)
    assert torch.equal(got.num_accepted, want.num_accepted)
    assert torch.equal(got.tokens, want.tokens)
    assert got.tokens is out[1]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_greedy_kernel_half_precision_logits(dtype):
    draft, logits, lens = _greedy_case(6, 7, 300, seed=9)
    logits = logits.to(dtype)
    got = verify_greedy(draft.int(), logits, lens, block_v=128, out=_poisoned(6, 7))
    want = torch_verify.verify_greedy(draft, logits, lens)
    assert torch.equal(got.tokens, want.tokens)


@pytest.mark.parametrize("vocab,block_v,dtype", [(300, 64, torch.float32), (33, 16, torch.float32),
                                                 (1000, 256, torch.bfloat16)])
def test_coupled_argmax_kernel_equals_the_torch_reference(vocab, block_v, dtype):
    """The fused kernel hashes the reference's very bits: every row (seeds up to 2^64 − 1, positions
    up to 2^32 − 1, tokens cut to −inf by top-k) picks the reference's token."""
    gen = torch.Generator().manual_seed(vocab)
    seeds = [0, 1, 2**64 - 1, 12345678901234567890, 7, 99]
    positions = torch.tensor([0, 1, 2**32 - 1, 17, 4096, 5])[:, None] + torch.arange(3)  # [6, 3]
    keys = row_keys(seeds, positions)  # [6, 3]
    weights = (torch.randn(6, 3, vocab, generator=gen) * 3).to(dtype)
    weights[0, :, : vocab // 2] = float("-inf")  # a row whose first half top-k removed
    weights[1, 0] = float("-inf")  # nothing left: torch.argmax says 0 (a tie over every block)
    want = (weights.float() + noise_of_keys(keys, vocab)).argmax(-1)  # [6, 3]
    got = coupled_argmax(weights.view(-1, vocab), keys.view(-1), block_v=block_v).view(6, 3)
    assert torch.equal(got, want)
    assert bool((got[0] >= vocab // 2).all())


def test_greedy_truncation_by_draft_lens():
    # every draft is right, so each row accepts exactly its scheduled length and adds a bonus
    draft, logits, _ = _greedy_case(4, 5, 40, seed=2)
    draft = logits.argmax(-1)[:, :5]
    lens = torch.tensor([0, 2, 5, 3])
    got = verify_greedy(draft, logits, lens, out=_poisoned(4, 5))
    assert got.num_accepted.tolist() == [0, 2, 5, 3]
    for r, n in enumerate(lens.tolist()):
        assert got.row(r) == logits.argmax(-1)[r, : n + 1].tolist()
        assert got.tokens[r, n + 1:].eq(PAD).all()


# -- confidence_verify: sampling -----------------------------------------------------------------

def _sampling_case(b, k, vocab, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(b, k + 1, vocab, generator=gen), -1)
    q = torch.softmax(2 * torch.randn(b, k, vocab, generator=gen), -1)
    q[0] = p[0, :k]  # p == q: nothing is rejected, the bonus comes from p
    if b > 1:  # disjoint supports on row 1: always rejected, the residual is p itself
        q[1, :, : vocab // 2] = 0
        p[1, :, vocab // 2:] = 0
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    p, q = p.to(dtype), q.to(dtype)
    draft = torch.multinomial(q.float().reshape(-1, vocab), 1, generator=gen).reshape(b, k)
    lens = torch.randint(0, k + 1, (b,), generator=gen)
    uniforms, u_last = draw_uniforms(b, k, gen)
    return draft, q, p, uniforms, u_last, lens


@pytest.mark.parametrize("b,k,vocab,block_v", [(6, 2, 20, None), (8, 7, 300, 64), (5, 16, 50, 16)])
@pytest.mark.parametrize("with_lens", [False, True])
def test_sampling_kernel_equals_explicit_reference(b, k, vocab, block_v, with_lens):
    draft, q, p, uniforms, u_last, lens = _sampling_case(b, k, vocab, seed=b + k)
    lens = lens if with_lens else None
    got = verify_sampling(draft, q, p, uniforms, u_last, lens, block_v=block_v, out=_poisoned(b, k))
    want = verify_sampling_explicit(draft, q, p, uniforms, u_last, lens)
    assert torch.equal(got.num_accepted, want.num_accepted)
    assert torch.equal(got.tokens, want.tokens)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sampling_kernel_half_precision_probs(dtype):
    draft, q, p, uniforms, u_last, lens = _sampling_case(8, 7, 300, seed=1, dtype=dtype)
    got = verify_sampling(draft.int(), q, p, uniforms, u_last, lens, block_v=128, out=_poisoned(8, 7))
    want = verify_sampling_explicit(draft, q, p, uniforms, u_last, lens)
    assert torch.equal(got.tokens, want.tokens)


def test_inverse_cdf_law_and_zero_mass():
    dist = torch.tensor([0.0, 0.2, 0.0, 0.5, 0.3, 0.0])
    u = torch.rand(50_000, generator=torch.Generator().manual_seed(0))
    draws = inverse_cdf(dist.expand(len(u), -1), u)
    freq = torch.bincount(draws, minlength=6).float() / len(u)
    assert freq[[0, 2, 5]].sum() == 0
    assert 0.5 * (freq - dist).abs().sum() < 0.01
    edge = inverse_cdf(torch.tensor([[0.25, 0.75, 0.0]]), torch.tensor([1.0]))  # u·total == total
    assert edge.tolist() == [1]


# The law of the emitted tokens, as tests/test_verify.py checks it for verify_sampling
V = 6
DRAWS = 40_000
TV_BOUND = 0.015  # TV of 40k draws over 6 outcomes is ~0.005 when the rule is right
P_ROWS = torch.tensor([[0.4, 0.3, 0.1, 0.1, 0.05, 0.05], [0.1, 0.1, 0.2, 0.2, 0.2, 0.2],
                       [0.05, 0.05, 0.1, 0.1, 0.3, 0.4]])
Q_ROWS = torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.1, 0.1], [0.3, 0.3, 0.1, 0.1, 0.1, 0.1]])


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a - b).abs().sum().item()


def _broken_q_over_p(draft, q, p, uniforms, u_last, draft_lens=None):
    """A wrong rule on purpose: accept with min(1, q/p) instead of min(1, p/q)."""
    return verify_sampling_explicit(draft, p[:, : draft.shape[1]], torch.cat([q, p[:, -1:]], 1),
                                    uniforms, u_last, draft_lens)


def _emitted_law(rule, position: int, seed: int, draft_len: int | None = None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    k = Q_ROWS.shape[0]
    p, q = P_ROWS.expand(DRAWS, k + 1, V), Q_ROWS.expand(DRAWS, k, V)
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(DRAWS, k)
    lens = None if draft_len is None else torch.full((DRAWS,), draft_len)
    out = rule(draft, q, p, *draw_uniforms(DRAWS, k, gen), lens)
    tokens = out.tokens[:, position]
    tokens = tokens[tokens != PAD]
    return torch.bincount(tokens, minlength=V).float() / len(tokens)


@pytest.mark.parametrize("position,draft_len", [(0, None), (1, None), (2, None), (1, 1)])
def test_explicit_reference_reproduces_target(position, draft_len):
    emitted = _emitted_law(verify_sampling_explicit, position, seed=20 + position, draft_len=draft_len)
    assert _tv(emitted, P_ROWS[position]) < TV_BOUND, (emitted, P_ROWS[position])


def test_broken_rule_is_caught():
    emitted = _emitted_law(_broken_q_over_p, 0, seed=5)
    assert _tv(emitted, P_ROWS[0]) > 5 * TV_BOUND


# -- confidence_verify: draft trees ------------------------------------------------------------

def _trees(r, vocab, seed):
    """A grown tree per row (ragged: one row cut to 3 nodes, one empty) and a chain, with a repeated
    sibling token in row 0."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.log_softmax(2 * torch.randn(r, 4, vocab, generator=gen), -1)
    tree = grow_tree(scores[:, 0], lambda d, f, _: scores[:, d, None], topk=3, nodes=9, depth=4)
    tree.tokens[0, 1] = tree.tokens[0, 0]  # nodes 1 and 2 are both children of the root
    tree.sizes[1], tree.sizes[2] = 3, 0
    chain = DraftTree.chain(torch.randint(0, vocab, (r, 9), generator=gen))
    return gen, [tree, chain]


def _target_rows(tree, vocab, gen):
    """Logits [r, n+1, V] whose argmax is often the drafted child, so paths get long."""
    r, n = tree.tokens.shape
    logits = 3 * torch.randn(r, n + 1, vocab, generator=gen)
    hit = torch.rand(r, n, generator=gen) < 0.6
    rows = torch.arange(r)[:, None].expand(r, n)
    logits[rows[hit], tree.parents[hit], tree.tokens[hit]] += 10
    return logits


@pytest.mark.parametrize("vocab,block_v", [(40, 16), (300, 128)])
def test_tree_kernels_equal_reference(vocab, block_v):
    """Greedy and sampling tree kernels give the torch rules' verdicts token for token."""
    gen, trees = _trees(5, vocab, seed=vocab)
    for tree in trees:
        for _ in range(2):
            logits = _target_rows(tree, vocab, gen)
            want = tree_verify.verify_tree_greedy(tree.tokens, tree.parents, tree.sizes, logits)
            got = verify_tree_greedy(tree.tokens.int(), tree.parents.int(), tree.sizes, logits,
                                     block_v=block_v)
            for name in ("num_accepted", "path", "tokens"):
                assert torch.equal(getattr(got, name), getattr(want, name)), name
            p = torch.softmax(logits / 3, -1)
            uniforms, u_last = draw_uniforms(*tree.tokens.shape, gen)
            args = (tree.tokens, tree.parents, tree.sizes, p, uniforms, u_last)
            want = tree_verify.verify_tree_sampling(*args)
            got = verify_tree_sampling(*args, block_v=block_v)
            for name in ("num_accepted", "path", "tokens"):
                assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_tree_kernel_chain_equals_chain_kernel():
    """A chain given to the greedy tree kernel gets the chain kernel's verdict."""
    gen, (_, chain) = _trees(4, 50, seed=1)
    logits = _target_rows(chain, 50, gen)
    got = verify_tree_greedy(chain.tokens, chain.parents, chain.sizes, logits)
    want = verify_greedy(chain.tokens, logits)
    assert torch.equal(got.num_accepted, want.num_accepted) and torch.equal(got.tokens, want.tokens)


# -- TensorRT boundary ---------------------------------------------------------------------------

_PTX_SCRIPT = textwrap.dedent("""
    import json, re, triton
    from triton.backends.compiler import GPUTarget
    from plugins.confidence_verify import kernel as verify
    from plugins.confidence_verify import tree_kernel as tree
    from plugins.kv_injection_attention import kernel as attention
    jobs = [
        (attention.kv_injection_attention_kernel, attention.aot_signature("fp16"),
         attention.kernel_constexprs(128, 64, 64, has_ctx_lens=True)),
        (verify.verify_greedy_kernel, verify.greedy_aot_signature("bf16"),
         dict(HAS_LENS=True, BLOCK_V=1024, BLOCK_K=16)),
        (verify.verify_sampling_kernel, verify.sampling_aot_signature("fp32"),
         dict(HAS_LENS=True, BLOCK_V=1024, BLOCK_K=16)),
        (tree.verify_tree_greedy_kernel, tree.tree_greedy_aot_signature("bf16"),
         dict(BLOCK_V=1024, BLOCK_N=32)),
        (tree.verify_tree_sampling_kernel, tree.tree_sampling_aot_signature("fp32"),
         dict(BLOCK_V=512, BLOCK_N=32)),
    ]
    report = []
    for fn, signature, constexprs in jobs:
        src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
        entry = ptx[ptx.index(".entry"):]
        declared = len(re.findall(r"\\.param \\.", entry[: entry.index(")")]))
        read = sorted({int(i) for i in re.findall(r"_param_(\\d+)\\]", ptx)})
        report.append([fn.__name__, len(signature), declared, read])
    print(json.dumps(report))
""")


def test_aot_ptx_takes_inputs_scalars_outputs():
    """The aot_impl signatures compile to sm_90 PTX whose used parameters are exactly ours.

    Triton appends two scratch pointers that TensorRT does not pass; they must stay unread."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["OMP_NUM_THREADS"] = "1"
    run = subprocess.run([sys.executable, "-c", _PTX_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    for name, n_args, declared, read in __import__("json").loads(run.stdout.strip().splitlines()[-1]):
        assert declared == n_args + 2, (name, declared, n_args)
        assert read == list(range(n_args)), (name, read)


def test_trt_plugin_import_without_tensorrt_is_one_clear_error():
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("tensorrt is installed here: the plugins register instead of failing")
    for module in ("plugins.kv_injection_attention.trt_plugin", "plugins.confidence_verify.trt_plugin",
                   "plugins.confidence_verify.tree_trt_plugin"):
        with pytest.raises(TrtspecError, match=re.escape("TensorRT is not installed")) as info:
            __import__(module)
        assert "\n" not in str(info.value) and "pip install tensorrt" in str(info.value)


def test_an_interpreter_that_cannot_run_the_kernels_is_named_before_a_launch():
    # triton 3.6.0 (the GPU image's) under numpy 2.4.6: every loop bound failed in the interpreter
    # with "only 0-dimensional arrays can be converted" (measured in a venv of those versions)
    problem = interpreter_problem("3.6.0", "2.4.6")
    assert problem is not None and "triton>=3.7 or numpy<2.4" in problem and "3.6.0" in problem
    assert interpreter_problem("3.6.0", "2.5.2") is not None
    assert interpreter_problem("3.7.1", "2.4.6") is None  # the interpreter reads a scalar since 3.7
    assert interpreter_problem("3.6.0", "2.3.5") is None  # numpy only warned before 2.4
    assert interpreter_problem("3.6.0", "1.26.4") is None
    assert interpreter_problem("3.10.0", "2.5.0") is None
    # by major.minor: a Triton 3.7 nightly reads scalars, a numpy 2.4 release candidate refuses
    assert interpreter_problem("3.7.0.dev0", "2.4.6") is None
    assert interpreter_problem("3.6.0+git9a1b", "2.4.0rc1") is not None
