"""DFlash: z-lab checkpoint layout, fit checks, cached-context == from-scratch, training == inference."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from trtspec.errors import CheckpointError
from trtspec.models.dflash import (
    DFlashDraftModel,
    build_target_layer_ids,
    load_dflash,
    save_dflash,
)
from trtspec.models.dflash_drafter import DFlashDrafter
from trtspec.models.target import TargetModel, load_causal_lm
from trtspec.train.dflash import DFlashTrainConfig, block_mask, dflash_loss, new_drafter

from .conftest import draft_rows, with_slots


@pytest.fixture(scope="module")
def target(random_qwen3_dir):
    return load_causal_lm(random_qwen3_dir)


@pytest.fixture(scope="module")
def drafter_model(target) -> DFlashDraftModel:
    torch.manual_seed(0)
    cfg = DFlashTrainConfig(block_size=6, num_layers=2, target_layer_ids=[0, 2], init_from_target=False)
    model = new_drafter(target, mask_token_id=258, cfg=cfg)
    with torch.no_grad():  # norms start at 1: perturb them so a name mix-up would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def test_layer_ids_formula():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(36, 1) == [18]
    assert build_target_layer_ids(52, 5) == [1, 13, 25, 37, 49]


def _taps(target, ids, layer_ids):
    """ids [1, t] -> the taps [t, n·H] a target forward gives the drafter."""
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1] for i in layer_ids], -1)[0]


def _ids(seed: int, n: int) -> torch.Tensor:
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


def _drafter(target, model, ids, capacity: int = 256) -> DFlashDrafter:
    """A one-slot drafter that has absorbed the context ids[:-1]; the anchor is ids[-1]."""
    d = with_slots(DFlashDrafter(model, target.get_input_embeddings(), target.get_output_embeddings()), 1,
                   capacity)
    d.begin(0, ids[0, :-1].tolist(), _taps(target, ids[:, :-1], model.spec.target_layer_ids))
    return d


def test_roundtrip_identical_logits(tmp_path, target, drafter_model):
    save_dflash(drafter_model, tmp_path)
    loaded = load_dflash(tmp_path, target.config)
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(1))
    outs = []
    for model in (drafter_model, loaded):
        d = with_slots(DFlashDrafter(model, target.get_input_embeddings(), target.get_output_embeddings()))
        d.begin(0, ids[0, :-1].tolist(), _taps(target, ids[:, :-1], model.spec.target_layer_ids))
        outs.append(d.draft_logits(draft_rows(ids[0].tolist()), 5))
    assert torch.equal(outs[0], outs[1])


def test_published_layout_written_by_hand_loads(tmp_path, target):
    """A minimal writer of z-lab's layout (names and config fields from z-lab/dflash)."""
    h, inter, d, heads, kv = 64, 96, 16, 4, 2
    gen = torch.Generator().manual_seed(5)
    tensors = {"fc.weight": torch.randn(h, 2 * h, generator=gen), "hidden_norm.weight": torch.ones(h),
               "norm.weight": torch.ones(h)}
    shapes = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
              "self_attn.q_proj.weight": (heads * d, h), "self_attn.k_proj.weight": (kv * d, h),
              "self_attn.v_proj.weight": (kv * d, h), "self_attn.o_proj.weight": (h, heads * d),
              "self_attn.q_norm.weight": (d,), "self_attn.k_norm.weight": (d,),
              "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
              "mlp.down_proj.weight": (h, inter)}
    for name, shape in shapes.items():
        tensors[f"layers.0.{name}"] = torch.randn(*shape, generator=gen)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 8,
        "dflash_config": {"mask_token_id": 258, "target_layer_ids": [0, 2]},
        "num_target_layers": 3, "num_hidden_layers": 1, "hidden_size": h, "intermediate_size": inter,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d, "vocab_size": 264,
        "rms_norm_eps": 1e-6, "rope_theta": 10000, "max_position_embeddings": 512,
        "hidden_act": "silu", "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_dflash(tmp_path, target.config)
    assert model.spec.block_size == 8 and model.spec.target_layer_ids == [0, 2]
    state = model.state_dict()
    for name, tensor in tensors.items():
        assert torch.equal(state[name], tensor), name


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda c: c.update(hidden_size=32, head_dim=8), "hidden_size is 32 but the target has 64"),
        (lambda c: c.update(num_target_layers=5), "num_target_layers is 5 but the target has 3"),
        (lambda c: c["dflash_config"].update(target_layer_ids=[0, 3]),
         r"target_layer_ids \[0, 3\] has \[3\]"),
        (lambda c: c["dflash_config"].update(mask_token_id=264), "mask_token_id 264 is outside"),
        (lambda c: c.update(block_size=1), "block_size is 1; DFlash needs at least 2"),
        # a TypeError traceback (2**70) or a run that did not end (more than the target's context)
        *[(lambda c, n=n: c.update(block_size=n), f"block_size {n} is more than the target's "
           "max_position_embeddings 512") for n in (513, 2**70)],
        # SpecForge's training configs carry `mask_token_id: null` (it was a TypeError traceback)
        (lambda c: c["dflash_config"].update(mask_token_id=None),
         "dflash_config.mask_token_id must be an integer, got None"),
        (lambda c: c["dflash_config"].update(target_layer_ids="0,2"),
         "dflash_config.target_layer_ids must be a list of layer indices, got '0,2'"),
        (lambda c: c["dflash_config"].pop("mask_token_id"),
         "missing DFlash field 'dflash_config.mask_token_id': is it a DFlash checkpoint\\?"),
        # "abc" was read as a section without fields (missing mask_token_id), 2.5 a TypeError naming no field
        *[(lambda c, v=v: c.update(dflash_config=v), f"dflash_config must be an object, got {v!r}")
          for v in ("abc", 2.5, 0, False)],
        # taken as they were: the drafts came out of NaN hidden states, or at rope_theta 1
        (lambda c: c.update(rms_norm_eps=float("nan")), "rms_norm_eps must be a finite number >= 0, got nan"),
        (lambda c: c["rope_parameters"].update(rope_theta=True),
         "rope_parameters.rope_theta must be a finite number > 0, got True"),
        # TensorRT-LLM reads the top-level one, this loader read the nested one: they would differ
        (lambda c: c["dflash_config"].update(block_size=c["block_size"] + 2),
         r"block_size 6 and dflash_config.block_size 8 differ"),
    ],
)
def test_misfits_refused(tmp_path, target, drafter_model, edit, message):
    save_dflash(drafter_model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        load_dflash(tmp_path, target.config)


def test_unreadable_checkpoint_folders_refused(tmp_path, target, drafter_model):
    """Each names the file: no config.json, config.json that is not JSON, no weights."""
    with pytest.raises(CheckpointError, match=r"config.json is missing: not a DFlash checkpoint directory"):
        load_dflash(tmp_path, target.config)
    save_dflash(drafter_model, tmp_path)
    (tmp_path / "config.json").write_text('{"block_size": 6,')
    with pytest.raises(CheckpointError, match=rf"{tmp_path}/config.json is not valid JSON"):
        load_dflash(tmp_path, target.config)
    save_dflash(drafter_model, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"has no \*.safetensors weights"):
        load_dflash(tmp_path, target.config)


@pytest.mark.parametrize("graphs", [False, True], ids=["packed", "padded"])
def test_cached_context_equals_from_scratch(target, drafter_model, graphs):
    """Absorbing context over several cycles (and several commits piled up between proposals)
    gives the drafts of one fresh pass; another request in another slot changes nothing. Padded
    (`cuda_graphs`: the context projections and block forwards in static shapes, what CUDA
    graphs replay; eagerly here) as well."""
    ids = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(2))
    other = torch.randint(0, 256, (1, 25), generator=torch.Generator().manual_seed(9))
    layer_ids = drafter_model.spec.target_layer_ids
    taps, other_taps = _taps(target, ids, layer_ids), _taps(target, other, layer_ids)
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    incremental = with_slots(DFlashDrafter(drafter_model, emb, head, cuda_graphs=graphs), 3)
    ctx = 10
    incremental.begin(2, ids[0, :ctx].tolist(), taps[:ctx])
    incremental.begin(0, other[0, :20].tolist(), other_taps[:20])
    for cut in (14, 15, 22):  # the target caches 4, 1 and 7 more positions
        rows = draft_rows(other[0, :21].tolist(), [], ids[0, : ctx + 1].tolist())
        incremental.draft_logits([rows[0], rows[2]], 5)
        mid = (ctx + cut) // 2
        incremental.commit(2, mid - ctx - 1, taps[ctx:mid])
        incremental.commit(2, cut - mid - 1, taps[mid:cut])  # two commits before the next proposal
        ctx = cut
    fresh = with_slots(DFlashDrafter(drafter_model, emb, head))
    fresh.begin(0, ids[0, :22].tolist(), taps[:22])
    a = incremental.draft_logits([draft_rows([], [], ids[0, :23].tolist())[2]], 5)
    b = fresh.draft_logits(draft_rows(ids[0, :23].tolist()), 5)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    if graphs:  # every projection padded (the prompts' 10 and 20 positions fit a graph's 32)
        assert incremental.projections.num_steps == 4 and incremental.graphed.num_steps == 4


def test_training_blocks_equal_inference_blocks(target, drafter_model):
    """The masked, packed training forward sees exactly what drafting at that anchor sees."""
    seq = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(3))
    taps = _taps(target, seq, drafter_model.spec.target_layer_ids)[None]  # [1, 40, n·H]
    anchors = torch.tensor([[7, 19, 30]])
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    block = drafter_model.spec.block_size
    pos = (anchors[..., None] + torch.arange(block)).reshape(1, -1)
    ids = torch.full_like(pos, 258)
    ids[:, ::block] = seq.gather(1, anchors)
    ctx_kv = drafter_model.project_context(taps, torch.arange(40)[None])
    with torch.no_grad():
        packed = drafter_model(emb(ids), pos, ctx_kv, block_mask(anchors, 40, block))
    for j, a in enumerate(anchors[0].tolist()):
        d = with_slots(DFlashDrafter(drafter_model, emb, head))
        d.begin(0, seq[0, :a].tolist(), taps[0, :a])
        expected = d.draft_logits(draft_rows(seq[0, : a + 1].tolist()), block - 1)[0]
        got = head(packed[0, j * block + 1 : (j + 1) * block])
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    loss, acc = dflash_loss(drafter_model, emb, head, seq, taps, anchors, gamma=4.0)
    assert loss.item() > 0 and acc.shape == (block - 1,)


def test_a_block_past_the_response_s_end_trains_on_the_slots_before_it(target, drafter_model):
    """Labels past a sequence's valid length (its padding) carry no weight: a block whose every
    label exists loses what it lost before, and tokens past the end change nothing."""
    seq = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(4))
    taps = _taps(target, seq, drafter_model.spec.target_layer_ids)[None]
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    whole = torch.tensor([[3, 12, 20]])  # blocks of 6 within the first 30 tokens
    with torch.no_grad():
        unmasked, _ = dflash_loss(drafter_model, emb, head, seq, taps, whole, 4.0)
        masked, _ = dflash_loss(drafter_model, emb, head, seq, taps, whole, 4.0, torch.tensor([30]))
        assert masked.item() == pytest.approx(unmasked.item(), rel=1e-6)
        past = torch.tensor([[3, 26, 28]])  # 3 and 1 labels before the end at 30
        padded = seq.clone()
        padded[0, 30:] = 256  # what regeneration pads with
        loss, acc = dflash_loss(drafter_model, emb, head, seq, taps, past, 4.0, torch.tensor([30]))
        again, acc_again = dflash_loss(drafter_model, emb, head, padded, taps, past, 4.0, torch.tensor([30]))
    assert again.item() == pytest.approx(loss.item(), rel=1e-6) and torch.equal(acc, acc_again)


def test_greedy_lossless_with_untrained_drafter(random_qwen3_dir, target, drafter_model, tmp_path):
    from trtspec.spec.decoder import SpeculativeDecoder

    save_dflash(drafter_model, tmp_path)
    model = load_dflash(tmp_path, target.config)
    tgt = TargetModel(target, tuple(model.spec.target_layer_ids))
    drafter = DFlashDrafter(model, target.get_input_embeddings(), target.get_output_embeddings())
    spec = SpeculativeDecoder(tgt, drafter, end_ids=(256,))
    plain = SpeculativeDecoder(TargetModel(target), None, end_ids=(256,))
    for seed in range(3):
        ids = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
        assert spec.generate(ids, 50).token_ids == plain.generate(ids, 50).token_ids


@pytest.mark.parametrize("name", ["tiny-dflash-b16", "tiny-dspark-b15", "tiny-eagle3"])
def test_a_drafter_in_bfloat16_keeps_rope_frequencies_in_float32(name):
    """Loaded in bfloat16 a drafter's weights are bfloat16 but its RoPE inverse frequencies stay the
    float32 ones, as transformers keeps a target's (rounded, far-apart positions rotate wrong)."""
    from trtspec.config import ASSETS_DIR
    from trtspec.models.dspark import load_dspark
    from trtspec.models.eagle3 import load_eagle3

    load = {"tiny-dflash-b16": load_dflash, "tiny-dspark-b15": load_dspark, "tiny-eagle3": load_eagle3}[name]
    exact, low = (load(ASSETS_DIR / name, dtype=dtype) for dtype in (torch.float32, torch.bfloat16))
    freqs = dict(exact.named_buffers())
    kept = {n: b for n, b in low.named_buffers() if n.endswith("inv_freq")}
    assert kept and all(b.dtype == torch.float32 and torch.equal(b, freqs[n]) for n, b in kept.items())
    assert {p.dtype for p in low.parameters()} == {torch.bfloat16}
    # and they stay out of its state_dict, as transformers registers them (not persistent): a drafter's
    # state loads into a fresh one strict
    assert not [key for key in low.state_dict() if key.endswith("inv_freq")]


def test_left_to_its_defaults_a_drafter_drafts_its_whole_block_eagerly(target, drafter_model):
    """Without num_draft_tokens a DFlash drafter drafts B − 1 tokens, without cuda_graphs it pads no
    step, and a tree asking deeper than its block stops at draft slot B − 1: a top-1 tree is then the
    greedy chain of the whole block."""
    from trtspec.config import TreeConfig

    ids = _ids(44, 15)
    d = _drafter(target, drafter_model, ids)
    assert drafter_model.spec.block_size == 6 and d.num_draft_tokens == 5
    assert d.graphed is None and d.projections is None
    assert d.tree_depth(TreeConfig(nodes=64, topk=1, depth=64)) == 5
    chain = d.propose(draft_rows(ids[0].tolist()), 5).tokens
    tree = d.propose_tree(draft_rows(ids[0].tolist()), TreeConfig(nodes=64, topk=1, depth=64))
    assert chain[0, 0] != chain[0, 1]  # a root child taken from another slot would show
    assert tree.sizes == [5] and torch.equal(tree.tokens[:, :5], chain)
    assert tree.parents[0, :5].tolist() == [0, 1, 2, 3, 4]
    assert d.num_forwards == 2  # one block forward each


def test_a_context_filling_the_capacity_drafts_as_one_with_room_to_spare(target, drafter_model):
    """`allocate(capacity=n)` holds a request of n positions and the block written after them."""
    ids = _ids(12, 20)
    outs = []
    for capacity in (20, 256):  # the anchor sits at position 19, the block's last slot at 24
        d = _drafter(target, drafter_model, ids, capacity)
        outs.append(d.draft_logits(draft_rows(ids[0].tolist()), 5))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-6, rtol=1e-5)


def test_tidy_projects_the_piles_of_absorb_at_positions_and_no_smaller_one(target, drafter_model):
    """A pile of exactly ABSORB_AT positions is projected by `tidy` (and then drafts as without it);
    one of ABSORB_AT − 1 stays pending."""
    from trtspec.models.dflash_drafter import ABSORB_AT

    ids = torch.randint(0, 256, (1, ABSORB_AT + 1), generator=torch.Generator().manual_seed(13))
    taps = _taps(target, ids[:, :-1], drafter_model.spec.target_layer_ids)
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    d = with_slots(DFlashDrafter(drafter_model, emb, head), 2, 512)
    d.begin(0, ids[0, : ABSORB_AT - 1].tolist(), taps[: ABSORB_AT - 1])
    d.begin(1, ids[0, :ABSORB_AT].tolist(), taps)
    d.tidy()
    assert d.ctx_len == {0: 0, 1: ABSORB_AT} and d.pending.positions == {0: ABSORB_AT - 1}
    fresh = with_slots(DFlashDrafter(drafter_model, emb, head), 1, 512)
    fresh.begin(0, ids[0, :ABSORB_AT].tolist(), taps)
    tidied = d.draft_logits(draft_rows([], ids[0].tolist())[1:], 5)
    want = fresh.draft_logits(draft_rows(ids[0].tolist()), 5)
    torch.testing.assert_close(tidied, want, atol=1e-6, rtol=1e-5)


def test_a_release_that_keeps_nothing_projects_nothing(target, drafter_model):
    """Released without its tokens a slot's pending taps are dropped, not projected (counted by the
    padded projections, `cuda_graphs`); released with them they are projected for a next prompt."""
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(14))
    taps = _taps(target, ids, drafter_model.spec.target_layer_ids)
    d = with_slots(DFlashDrafter(drafter_model, target.get_input_embeddings(), target.get_output_embeddings(),
                                 cuda_graphs=True), 2)
    d.begin(0, ids[0].tolist(), taps)
    d.begin(1, ids[0].tolist(), taps)
    d.release(0)
    assert d.projections.num_steps == 0 and d.reusable(0, ids[0].tolist()) == 0
    d.release(1, ids[0].tolist())
    assert d.projections.num_steps == 1 and d.reusable(1, ids[0].tolist()) == 10
    assert [shape[2] for shape in d.projections.graphs] == [1]  # a projection attends to nothing: K is 1


def test_a_build_takes_at_most_b_minus_1_drafts(tmp_path, target, drafter_model):
    """`drafter.num_draft_tokens` up to B − 1 (or unset: B − 1) builds; B is refused by name."""
    from trtspec.config import DrafterConfig
    from trtspec.models.drafter import build_drafter

    save_dflash(drafter_model, tmp_path)
    tgt = TargetModel(target, tuple(drafter_model.spec.target_layer_ids))
    for k, want in ((None, 5), (5, 5), (1, 1)):
        built = build_drafter(DrafterConfig(method="dflash", path=str(tmp_path), num_draft_tokens=k), tgt)
        assert isinstance(built, DFlashDrafter) and built.num_draft_tokens == want
    with pytest.raises(CheckpointError, match="is 6 but the DFlash block size 6 yields at most 5 drafts"):
        build_drafter(DrafterConfig(method="dflash", path=str(tmp_path), num_draft_tokens=6), tgt)


def test_a_gumbel_coupled_row_drafts_slot_j_at_its_position_in_chains_and_trees(target, drafter_model):
    """A Gumbel-coupled row's draft at block slot j + 1 is argmax(log q + g(seed, n + j)), n its
    committed tokens (slot 1 sits at position n), in a chain and as a top-1 tree's depth-j + 1 node."""
    from trtspec.config import TreeConfig
    from trtspec.spec.coupling import gumbel_noise
    from trtspec.spec.sampling import SamplingParams

    ids = _ids(45, 17)
    d = _drafter(target, drafter_model, ids)
    sampling = SamplingParams(temperature=0.7, seed=987, coupling="gumbel")
    rows = draft_rows(ids[0].tolist(), sampling=sampling)
    logits = d.draft_logits(rows, 5)  # [1, 5, V]
    n, vocab = ids.shape[1], logits.shape[-1]

    def coupled(first):  # the coupled drafts of slots 1..5 were slot 1 at position `first`
        g = gumbel_noise([987], [list(range(first, first + 5))], vocab)  # [1, 5, V]
        return (torch.log_softmax(logits / 0.7, -1) + g).argmax(-1)  # [1, 5]

    want = coupled(n)
    assert not torch.equal(want, coupled(n + 1))  # a position off by one would draft otherwise
    assert torch.equal(d.propose(rows, 5).tokens, want)
    tree = d.propose_tree(rows, TreeConfig(nodes=5, topk=1, depth=5))
    assert tree.sizes == [5] and torch.equal(tree.tokens[:, :5], want)
    assert tree.parents[0, :5].tolist() == [0, 1, 2, 3, 4]


def test_a_tree_wider_than_it_is_deep_takes_each_slot_s_top_k(target, drafter_model):
    """Top-4 children two slots deep, every candidate kept (4 + 16 nodes): the root's children are
    draft slot 1's 4 likeliest tokens and each of them has slot 2's 4 likeliest as its children."""
    from trtspec.config import TreeConfig

    ids = _ids(46, 14)
    d = _drafter(target, drafter_model, ids)
    rows = draft_rows(ids[0].tolist())
    logits = d.draft_logits(rows, 2)[0]  # [2, V]
    first, second = (set(logits[j].topk(4).indices.tolist()) for j in (0, 1))
    tree = d.propose_tree(rows, TreeConfig(nodes=20, topk=4, depth=2))
    assert tree.sizes == [20]
    tokens, parents = tree.tokens[0].tolist(), tree.parents[0].tolist()
    roots = [i + 1 for i, p in enumerate(parents) if p == 0]  # node ids of the root's children
    assert len(roots) == 4 and {tokens[i - 1] for i in roots} == first
    for node in roots:
        assert sorted(tokens[i] for i, p in enumerate(parents) if p == node) == sorted(second)
