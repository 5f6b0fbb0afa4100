"""EAGLE-3: published checkpoint layout, fit checks, d2t/t2d, cached chain == from-scratch,
training-time test == inference, greedy lossless."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from trtspec.errors import CheckpointError
from trtspec.models import eagle3_drafter
from trtspec.models.eagle3 import causal_mask, default_aux_layer_ids, load_eagle3, save_eagle3
from trtspec.models.eagle3_drafter import CATCH_UP_WINDOW, Eagle3Drafter
from trtspec.models.target import TargetModel, load_causal_lm
from trtspec.spec.decoder import SpeculativeDecoder
from trtspec.spec.sampling import SamplingParams
from trtspec.train.eagle3 import (
    Eagle3TrainConfig,
    _features,
    choose_aux_layer_ids,
    eagle3_ttt_loss,
    new_drafter,
    select_draft_vocab,
    soft_label_logits,
    ttt_forward,
)

from .conftest import draft_rows, with_slots

LAYERS = [0, 1, 2]


@pytest.fixture(scope="module")
def target(random_qwen3_dir):
    return load_causal_lm(random_qwen3_dir)


def _drafter_model(target, draft_vocab_size=None, seed=0):
    torch.manual_seed(seed)
    model = new_drafter(target, Eagle3TrainConfig(aux_layer_ids=LAYERS, draft_vocab_size=draft_vocab_size))
    with torch.no_grad():  # norms start at 1: perturb them so a name mix-up would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
        model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        if draft_vocab_size:  # every third target id, so d2t offsets are non-trivial
            kept = torch.arange(0, 3 * draft_vocab_size, 3)
            model.d2t.copy_(kept - torch.arange(draft_vocab_size))
            model.t2d.zero_()
            model.t2d[kept] = True
    return model.eval()


@pytest.fixture(scope="module")
def drafter_model(target):
    return _drafter_model(target)


def _taps(target, ids, layer_ids=LAYERS):
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1] for i in layer_ids], -1)


def _ids(n, seed):
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


def _chain_logits(model, target, ids, k, forced=None):
    """Fresh drafter over ids[:, :-1] (cached by the target), chain of k from ids[-1]."""
    d = with_slots(Eagle3Drafter(model))
    d.begin(0, ids[0, :-1].tolist(), _taps(target, ids[:, :-1])[0])
    feed = iter(forced or [])

    def choose(logits):  # [1, V] -> [1]
        token = next(feed, None)
        return logits.argmax(-1) if token is None else token.reshape(1)

    return torch.stack(d.draft_chain(draft_rows(ids[0].tolist()), k, choose), 1)  # [1, k, V]


def test_aux_layer_defaults():
    assert default_aux_layer_ids(36) == [1, 17, 32]  # Qwen3-8B, SpecForge's default
    assert default_aux_layer_ids(32) == [1, 15, 28]
    assert choose_aux_layer_ids(36) == [1, 17, 32]
    assert choose_aux_layer_ids(6) == [1, 3, 4]  # [1, 2, 2] would repeat a layer
    assert choose_aux_layer_ids(3) == [0, 1, 2]


def test_roundtrip_identical_logits(tmp_path, target):
    model = _drafter_model(target, draft_vocab_size=60)
    save_eagle3(model, tmp_path, target.config.num_hidden_layers)
    loaded = load_eagle3(tmp_path, target.config)
    assert torch.equal(loaded.d2t, model.d2t) and torch.equal(loaded.t2d, model.t2d)
    ids = _ids(20, 1)
    assert torch.equal(_chain_logits(model, target, ids, 5), _chain_logits(loaded, target, ids, 5))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 60
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == LAYERS


def _published_checkpoint(path, with_embed=True, draft_vocab=100):
    """A minimal writer of the SafeAILab/SpecForge `LlamaForCausalLMEagle3` layout."""
    h, inter, d, heads, kv, vocab = 64, 96, 16, 4, 2, 264
    gen = torch.Generator().manual_seed(5)
    shapes = {
        "fc.weight": (h, 3 * h), "norm.weight": (h,), "lm_head.weight": (draft_vocab, h),
        "midlayer.hidden_norm.weight": (h,), "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (heads * d, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv * d, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, heads * d),
        "midlayer.mlp.gate_proj.weight": (inter, h), "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter),
    }
    if with_embed:
        shapes["embed_tokens.weight"] = (vocab, h)
    tensors = {name: torch.randn(*shape, generator=gen) for name, shape in shapes.items()}
    kept = torch.arange(vocab - draft_vocab, vocab)  # the last ids: offset vocab − draft_vocab
    tensors["d2t"] = kept - torch.arange(draft_vocab)
    tensors["t2d"] = torch.zeros(vocab, dtype=torch.bool)
    tensors["t2d"][kept] = True
    save_file(tensors, str(path / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": h, "intermediate_size": inter, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": d, "vocab_size": vocab, "draft_vocab_size": draft_vocab,
        "rms_norm_eps": 1e-6, "rope_theta": 10000, "rope_scaling": None, "max_position_embeddings": 512,
        "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": LAYERS},
    }
    (path / "config.json").write_text(json.dumps(config))
    return tensors


def test_published_layout_written_by_hand_loads(tmp_path, target):
    tensors = _published_checkpoint(tmp_path)
    model = load_eagle3(tmp_path, target.config)
    assert model.spec.draft_vocab_size == 100 and model.spec.aux_layer_ids == LAYERS
    state = model.state_dict()
    for name, tensor in tensors.items():
        assert torch.equal(state[name], tensor), name
    prop = with_slots(Eagle3Drafter(model, 6))
    ids = _ids(12, 6)
    prop.begin(0, ids[0, :-1].tolist(), _taps(target, ids[:, :-1])[0])
    tokens = prop.propose(draft_rows(ids[0].tolist()), 6).tokens
    assert tokens.shape == (1, 6) and (tokens >= 264 - 100).all()  # the draft vocab is the last 100 ids


def test_published_layout_without_embedding_borrows_the_target_s(tmp_path, target):
    _published_checkpoint(tmp_path, with_embed=False)
    embed = target.get_input_embeddings()
    model = load_eagle3(tmp_path, target.config, embed)
    assert torch.equal(model.embed_tokens.weight, embed.weight)
    with pytest.raises(CheckpointError, match=r"missing \['embed_tokens.weight'\]"):
        load_eagle3(tmp_path, target.config)


def _edit_config(**changes):
    return lambda c: c.update(changes)


@pytest.mark.parametrize(
    "edit,message",
    [
        (_edit_config(target_hidden_size=32), "target_hidden_size is 32 but the target has 64"),
        (_edit_config(vocab_size=300), "vocab_size is 300 but the target has 264"),
        (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 1, 3]),
         r"eagle_aux_hidden_state_layer_ids \[0, 1, 3\] must be 3 layers .* \(out of range: \[3\]\)"),
        (lambda c: c.pop("eagle_config"), r"\[1, 0, -1\] must be 3 layers"),  # default for 3 layers
        (_edit_config(num_hidden_layers=2), "num_hidden_layers is 2; an EAGLE-3 drafter has one midlayer"),
        (_edit_config(draft_vocab_size=300), "draft_vocab_size is 300 but vocab_size is 264"),
        (_edit_config(norm_before_fc=True), "norm_before_fc is true"),
        # checked before the model is allocated (the first tensor by name that differs)
        (_edit_config(draft_vocab_size=90), r"d2t is \[100\] in the weights, \[90\] by config.json"),
        (_edit_config(hidden_size=32, head_dim=8, target_hidden_size=64),
         r"embed_tokens.weight is \[264, 64\] in the weights, \[264, 32\] by config.json"),
        # a field of the wrong type is named: bool("false") was True (a draft of another shape that
        # loaded), int("abc") a ValueError traceback
        (_edit_config(norm_before_residual="false"),
         "norm_before_residual must be true or false, got 'false'"),
        (_edit_config(norm_before_fc="false"), "norm_before_fc must be true or false, got 'false'"),
        (_edit_config(draft_vocab_size="abc"), "draft_vocab_size must be an integer, got 'abc'"),
        (_edit_config(target_hidden_size=64.5), "target_hidden_size must be an integer, got 64.5"),
        (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=["0", 1, 2]),
         r"eagle_config.eagle_aux_hidden_state_layer_ids must be a list of layer indices"),
        # false, 0 or "" ran the default layers as if the field were absent; an eagle_config that
        # is no object was an AttributeError naming no field
        *[(lambda c, v=v: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=v),
           rf"eagle_config.eagle_aux_hidden_state_layer_ids must be a list of layer indices, got {v!r}")
          for v in (False, 0, "", "1, 2, 3")],
        (lambda c: c.update(eagle_config=False, eagle_aux_hidden_state_layer_ids=0),
         "eagle_config must be an object, got False"),
        (_edit_config(eagle_config=[LAYERS]), r"eagle_config must be an object, got \[\["),
        # taken as they were: the drafts came out at rope_theta 1, or of NaN hidden states
        (_edit_config(rope_theta=True), "rope_parameters.rope_theta must be a finite number > 0, got True"),
        (_edit_config(rms_norm_eps=float("nan")), "rms_norm_eps must be a finite number >= 0, got nan"),
    ],
)
def test_misfits_refused(tmp_path, target, edit, message):
    _published_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        load_eagle3(tmp_path, target.config)


@pytest.mark.parametrize(
    "corrupt,message",
    [
        (lambda t: t["d2t"].__setitem__(0, 500), "d2t maps draft ids outside the target vocabulary"),
        (lambda t: t["d2t"].__setitem__(1, t["d2t"][0] - 1), "d2t maps two draft ids to the same target id"),
        (lambda t: t["t2d"].__setitem__(0, True), "t2d marks 101 target ids that differ from the 100"),
    ],
)
def test_inconsistent_vocab_maps_refused(tmp_path, target, corrupt, message):
    tensors = _published_checkpoint(tmp_path)
    corrupt(tensors)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=message):
        load_eagle3(tmp_path, target.config)


def test_d2t_t2d_mapping(target):
    model = _drafter_model(target, draft_vocab_size=50)
    kept = torch.arange(0, 150, 3)
    assert torch.equal(model.to_target_ids(torch.arange(50)), kept)
    draft_logits = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(0))
    full = model.to_target_logits(draft_logits)  # [2, 3, 264]
    assert torch.equal(full[..., kept], draft_logits)
    assert torch.isneginf(full[..., ~model.t2d]).all() and model.t2d.sum() == 50
    # the argmax over the target vocabulary is the mapped draft argmax
    assert torch.equal(full.argmax(-1), kept[draft_logits.argmax(-1)])
    # proposals only ever hold draft-vocabulary tokens, and q is zero elsewhere
    d = with_slots(Eagle3Drafter(model, 5))
    ids = _ids(16, 4)
    d.begin(0, ids[0, :-1].tolist(), _taps(target, ids[:, :-1])[0])
    prop = d.propose(draft_rows(ids[0].tolist(), sampling=SamplingParams(temperature=1.0), seed=1), 5)
    assert model.t2d[prop.tokens].all()
    assert prop.q_probs[..., ~model.t2d].sum() == 0
    torch.testing.assert_close(prop.q_probs.sum(-1), torch.ones(1, 5))


def test_select_draft_vocab_keeps_the_most_frequent_response_tokens():
    seqs = torch.tensor([[9, 9, 5, 5, 5, 7, 7, 3], [9, 9, 5, 7, 2, 2, 2, 2]])
    lens, prompt_lens = torch.tensor([8, 5]), torch.tensor([2, 2])  # responses: 5 5 5 7 7 3 | 5 7 2
    d2t, t2d = select_draft_vocab(seqs, lens, prompt_lens, 12, 2)
    assert t2d.nonzero().flatten().tolist() == [5, 7]
    assert (torch.arange(2) + d2t).tolist() == [5, 7]
    d2t, t2d = select_draft_vocab(seqs, lens, prompt_lens, 12, None)
    assert t2d.all() and not d2t.any()


def test_cached_context_equals_from_scratch(target, drafter_model):
    """Absorbing context over several cycles gives the chain of one fresh pass."""
    ids = _ids(30, 2)
    taps = _taps(target, ids)[0]
    incremental = with_slots(Eagle3Drafter(drafter_model), 2)
    ctx = 10
    incremental.begin(1, ids[0, :ctx].tolist(), taps[:ctx])
    for cut in (14, 15, 22):  # the target caches 4, 1 and 7 more positions
        incremental.draft_chain(draft_rows([], ids[0, : ctx + 1].tolist())[1:], 4, lambda lg: lg.argmax(-1))
        incremental.commit(1, cut - ctx - 1, taps[ctx:cut])
        ctx = cut
    rows = draft_rows([], ids[0, :23].tolist())[1:]
    a = torch.stack(incremental.draft_chain(rows, 5, lambda lg: lg.argmax(-1)), 1)
    b = _chain_logits(drafter_model, target, ids[:, :23], 5)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_long_catch_up_restarts_from_the_newest_positions(target, drafter_model, monkeypatch):
    """A row whose pending positions exceed CATCH_UP_WINDOW drafts exactly as a fresh drafter begun
    at the window: the same tokens and taps, stored from drafter slot 0 (RoPE sees distances only).
    While the plain steps pile up, only the window's taps are held."""
    w, n = CATCH_UP_WINDOW, CATCH_UP_WINDOW + 29
    ids = _ids(n + 1, 7)  # the target caches ids[:n]; ids[n] is the last committed token
    taps = _taps(target, ids)[0]
    greedy = lambda lg: lg.argmax(-1)  # noqa: E731
    caught_up = with_slots(Eagle3Drafter(drafter_model), 2)
    caught_up.begin(1, ids[0, :12].tolist(), taps[:12])  # 12 positions: absorbed whole
    caught_up.draft_chain(draft_rows([], ids[0, :13].tolist())[1:], 3, greedy)
    assert caught_up.dropped[1] == 0 and caught_up.ctx_len[1] == 12
    for j in range(12, n):  # plain steps pile up n − 12 > w positions, one a step
        caught_up.commit(1, 0, taps[j : j + 1])
        assert caught_up.pending.kept[1] == min(j - 11, w)
    assert caught_up.catch_up(1, n + 1) == w  # what the next proposal absorbs: the window
    a = torch.stack(caught_up.draft_chain(draft_rows([], ids[0].tolist())[1:], 5, greedy), 1)
    assert caught_up.dropped[1] == n - w and caught_up.ctx_len[1] == w and caught_up.catch_up(1, n + 1) == 0
    fresh = with_slots(Eagle3Drafter(drafter_model))
    fresh.begin(0, ids[0, n - w : n].tolist(), taps[n - w : n])
    b = torch.stack(fresh.draft_chain(draft_rows(ids[0, n - w :].tolist()), 5, greedy), 1)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    monkeypatch.setattr(eagle3_drafter, "CATCH_UP_WINDOW", n)  # no restart: the whole context
    assert not torch.allclose(_chain_logits(drafter_model, target, ids, 5), a, atol=1e-3)


def test_chain_with_kv_cache_equals_uncached_recomputation(target, drafter_model):
    """Each chain step equals one causal pass over all slots from scratch, no cache."""
    model, ids, k = drafter_model, _ids(18, 3), 5
    n = ids.shape[1] - 1
    cached = _chain_logits(model, target, ids, k)[0]  # [k, V]
    feats = model.fuse(_taps(target, ids[:, :-1]))  # [1, n, H]
    tokens = ids[:, 1:]  # slot j reads token j+1
    with torch.no_grad():
        for i in range(k):
            h, _ = model(tokens, feats, torch.arange(n + i)[None], None, causal_mask(0, n + i))
            logits = model.to_target_logits(model.draft_logits(h[:, -1]))[0]
            torch.testing.assert_close(logits, cached[i], atol=1e-5, rtol=1e-4)
            feats = torch.cat([feats, h[:, -1:]], 1)  # the step's own output is fed back
            tokens = torch.cat([tokens, logits.argmax(-1).view(1, 1)], 1)


def test_soft_labels_are_the_target_s_own_distribution(tiny_target_dir):
    """The soft labels p come from the stored last-layer tap, which is already final-normed
    (`models.taps`); normed a second time they were another distribution (tiny target: argmax
    agreed on 74 % of positions, mean TV 0.22). The trained tiny target's final norm is not all
    ones, so a second norm shows."""
    target = load_causal_lm(tiny_target_dir)
    seqs = torch.randint(0, 256, (3, 48), generator=torch.Generator().manual_seed(30))
    feats = _features(target, seqs, [1, 2, 3]).float()  # bfloat16 in storage, as training keeps them
    with torch.no_grad():
        p = torch.softmax(target(seqs).logits, -1)
    q = torch.softmax(soft_label_logits(target, feats), -1)
    assert (0.5 * (p - q).abs().sum(-1)).max() < 0.02  # bfloat16 rounding of the stored tap only


def test_training_time_test_equals_chain_drafting(target, drafter_model):
    """TTT step i at slot j sees what chain step i drafting from slot j sees (ground-truth tokens)."""
    model, steps = drafter_model, 4
    seq = _ids(24, 5)
    taps = _taps(target, seq)
    with torch.no_grad():
        logits = target(seq).logits
        for j in (3, 11, 17):
            forced = [seq[:, j + 1 + i : j + 2 + i] for i in range(1, steps)]
            expected = _chain_logits(model, target, seq[:, : j + 2], steps, forced)[0]  # [steps, V]
            got = torch.cat([model.to_target_logits(model.draft_logits(h[:, j : j + 1]))
                             for h in ttt_forward(model, seq, taps, steps)], 1)[0]
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
        loss, acc = eagle3_ttt_loss(model, seq, taps, logits, torch.ones_like(seq, dtype=torch.bool), 3, 0.8)
    assert loss.item() > 0 and acc.shape == (3,)


def test_ttt_loss_skips_labels_whose_target_argmax_the_draft_vocabulary_lacks(target):
    """Slot j's step-i soft label is p at position j+1+i; whether it counts must be decided by
    that p's argmax. It was decided by the argmax at j+2+i, the next label's: on the tiny target
    with a 32-token draft vocabulary 247 of 3,729 counted labels lay outside the vocabulary and
    244 inside it were dropped. Logits changed only where the argmax is outside the draft
    vocabulary (argmax kept) must leave the loss and accuracy unchanged."""
    model = _drafter_model(target, draft_vocab_size=80)
    seq = _ids(30, 31)
    taps = _taps(target, seq)
    gen = torch.Generator().manual_seed(32)
    logits = torch.randn(1, 30, target.config.vocab_size, generator=gen)
    outside = ~model.t2d  # [V] target ids the draft vocabulary lacks
    top = torch.where(torch.rand(1, 30, generator=gen) < 0.5,  # half the positions' argmax outside
                      outside.nonzero().flatten()[:30], model.t2d.nonzero().flatten()[:30])
    logits.scatter_(-1, top[..., None], 10.0)
    skipped = outside[logits.argmax(-1)]  # [1, 30]
    assert 5 < int(skipped.sum()) < 25
    changed = logits.clone()
    changed[skipped] += 3 * torch.rand(changed[skipped].shape, generator=gen)  # argmax kept
    assert torch.equal(changed.argmax(-1), logits.argmax(-1))
    mask = torch.ones_like(seq, dtype=torch.bool)
    with torch.no_grad():
        loss, acc = eagle3_ttt_loss(model, seq, taps, logits, mask, 3, 0.8)
        again, acc_again = eagle3_ttt_loss(model, seq, taps, changed, mask, 3, 0.8)
    assert again.item() == pytest.approx(loss.item(), rel=1e-6)
    assert torch.equal(acc_again, acc)


@pytest.mark.parametrize("draft_vocab_size", [None, 80])
def test_greedy_lossless_with_untrained_drafter(target, tmp_path, draft_vocab_size):
    model = _drafter_model(target, draft_vocab_size)
    save_eagle3(model, tmp_path, target.config.num_hidden_layers)
    loaded = load_eagle3(tmp_path, target.config)
    drafter = Eagle3Drafter(loaded, 4)
    spec = SpeculativeDecoder(TargetModel(target, drafter.tap_layer_ids), drafter, end_ids=(256,))
    plain = SpeculativeDecoder(TargetModel(target), None, end_ids=(256,))
    for seed in range(3):
        ids = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
        assert spec.generate(ids, 50).token_ids == plain.generate(ids, 50).token_ids


def test_tree_steps_score_what_chains_along_their_paths_score_packed_and_padded(target, drafter_model,
                                                                              monkeypatch):
    """EAGLE-3's tree steps, fed depth by depth (each node sees the context and its ancestors,
    some in earlier forwards, at RoPE position context + depth), score each frontier node's children
    as a chain forced along the node's path scores its next step, for two requests side by side;
    packed and padded for CUDA graphs (`cuda_graphs`, eager here) alike, and the padded catch-ups,
    chain steps and trees draft what the packed ones draft. A drafter's mistake would not show in
    the target's tokens: only here."""
    from trtspec.config import TreeConfig

    ids = [_ids(26, 11), _ids(19, 12)]
    taps = [_taps(target, x)[0] for x in ids]
    grow = eagle3_drafter.grow_tree
    # per drafter: depth -> (frontier [R, F], from_prev [R, F], scores [R, F, V])
    seen: list[dict[int, tuple]] = []

    def spy(root_scores, expand, *args):
        def recorded(d, frontier, from_prev):
            scores = expand(d, frontier, from_prev)
            seen[-1][d] = (frontier.clone(), from_prev.clone(), scores.clone())
            return scores
        return grow(root_scores, recorded, *args)

    monkeypatch.setattr(eagle3_drafter, "grow_tree", spy)
    drafters, trees = [], []
    for graphs in (False, True):
        d = with_slots(Eagle3Drafter(drafter_model, cuda_graphs=graphs), 2)
        for slot in (0, 1):
            d.begin(slot, ids[slot][0, :-1].tolist(), taps[slot][:-1])
        seen.append({})
        trees.append(d.propose_tree(draft_rows(ids[0][0].tolist(), ids[1][0].tolist()),
                                    TreeConfig(nodes=20, topk=3, depth=4)))
        drafters.append(d)
    assert torch.equal(trees[1].tokens, trees[0].tokens) and torch.equal(trees[1].parents, trees[0].parents)
    assert sorted(seen[0]) == sorted(seen[1]) == [1, 2, 3]
    for r in (0, 1):
        for record in seen:
            paths = [[]]  # the tokens from the root to each node of the previous frontier
            for d in (1, 2, 3):
                frontier, from_prev, scores = record[d]
                paths = [paths[max(p, 0)] + [t] for t, p in zip(frontier[r].tolist(), from_prev[r].tolist(),
                                                                 strict=True)]
                for path, got in zip(paths, scores[r], strict=True):
                    forced = [torch.tensor(t) for t in path]
                    want = _chain_logits(drafter_model, target, ids[r], d + 1, forced)[0, d].log_softmax(-1)
                    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    rows = draft_rows(ids[0][0].tolist(), ids[1][0].tolist())
    chains = [torch.stack(d.draft_chain(rows, 4, lambda lg: lg.argmax(-1)), 1) for d in drafters]
    torch.testing.assert_close(chains[1], chains[0], atol=1e-5, rtol=1e-4)
    padded = drafters[1].graphed
    assert padded.num_steps == drafters[1].num_forwards and any(trees for *_, trees in padded.graphs)


def _greedy(logits):
    return logits.argmax(-1)


def test_defaults_draft_7_and_a_context_at_the_capacity_drafts_as_with_room_to_spare(target, drafter_model):
    """Without num_draft_tokens a drafter drafts 7 (one absorption and 6 chain steps, each a forward),
    without cuda_graphs it pads no step, and `allocate(capacity=n)` holds a request of n positions with
    its chain after them."""
    ids = _ids(25, 21)
    taps = _taps(target, ids[:, :-1])[0]
    proposals = []
    for capacity in (25, 256):  # the chain's steps write drafter slots 24..29
        d = with_slots(Eagle3Drafter(drafter_model), 1, capacity)
        assert d.num_draft_tokens == 7 and not d.cuda_graphs and d.graphed is None
        d.begin(0, ids[0, :-1].tolist(), taps)
        proposals.append(d.propose(draft_rows(ids[0].tolist()), d.num_draft_tokens).tokens)
        assert d.num_forwards == 7
    assert proposals[0].shape == (1, 7) and torch.equal(proposals[0], proposals[1])


def test_a_reused_prefix_is_what_the_first_proposal_drops_and_drafts_as_fresh(target, drafter_model):
    """`reusable` is every position but the newest CATCH_UP_WINDOW + 1 (then the first proposal still
    restarts from the newest window), and a request begun on them drafts as one given every tap."""
    w = CATCH_UP_WINDOW
    d = with_slots(Eagle3Drafter(drafter_model), 2)
    assert [d.reusable(0, list(range(n))) for n in (1, w, w + 1, w + 2, w + 10)] == [0, 0, 0, 1, 9]
    ids = _ids(w + 11, 22)  # the target caches w + 10 positions
    prompt, taps = ids[0, :-1].tolist(), _taps(target, ids[:, :-1])[0]
    reused = d.reusable(1, prompt)
    d.begin(0, prompt, taps)
    d.begin(1, prompt, taps[reused:], reused=reused)
    rows = draft_rows(ids[0].tolist(), ids[0].tolist())
    fresh, kept = (torch.stack(d.draft_chain([row], 4, _greedy), 1) for row in rows)
    torch.testing.assert_close(kept, fresh, atol=1e-6, rtol=1e-5)


def test_a_pile_of_exactly_the_window_is_absorbed_after_the_context(target, drafter_model):
    """CATCH_UP_WINDOW pending positions are absorbed after the context (a restart needs more): the
    next draft is one causal pass over every position from scratch."""
    w, ctx = CATCH_UP_WINDOW, 12
    ids = _ids(ctx + w + 1, 23)
    taps = _taps(target, ids[:, :-1])[0]
    d = with_slots(Eagle3Drafter(drafter_model))
    d.begin(0, ids[0, :ctx].tolist(), taps[:ctx])
    d.draft_chain(draft_rows(ids[0, : ctx + 1].tolist()), 2, _greedy)
    d.commit(0, w - 1, taps[ctx:])
    got = d.draft_chain(draft_rows(ids[0].tolist()), 1, _greedy)[0]
    assert d.dropped[0] == 0 and d.ctx_len[0] == ctx + w
    n = ctx + w
    with torch.no_grad():
        h, _ = drafter_model(ids[:, 1:], drafter_model.fuse(taps[None]), torch.arange(n)[None], None,
                             causal_mask(0, n))
        want = drafter_model.to_target_logits(drafter_model.draft_logits(h[:, -1]))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_a_row_the_drafter_does_not_stand_for_is_refused(target, drafter_model):
    """A proposal for more committed tokens than the drafter absorbed (nothing pending) fails."""
    ids = _ids(12, 24)
    d = with_slots(Eagle3Drafter(drafter_model))
    d.begin(0, ids[0, :10].tolist(), _taps(target, ids[:, :10])[0])
    d.draft_chain(draft_rows(ids[0, :11].tolist()), 2, _greedy)
    with pytest.raises(RuntimeError, match="EAGLE-3 slot 0 stands for 10 positions, the target caches 11"):
        d.draft_chain(draft_rows(ids[0].tolist()), 2, _greedy)


def test_a_gumbel_coupled_top_1_tree_is_the_coupled_chain_at_its_positions(target, drafter_model):
    """A Gumbel-coupled row's top-1 tree is its chain of coupled drafts: the node at depth j + 1 is
    argmax(log q + g(seed, n + j)), n the row's committed tokens (the root's children at position n),
    for two rows of different lengths side by side and for one alone."""
    from trtspec.config import TreeConfig
    from trtspec.spec.coupling import gumbel_noise

    ids = [_ids(20, 31), _ids(15, 32)]
    d = with_slots(Eagle3Drafter(drafter_model), 2)
    for slot, x in enumerate(ids):
        d.begin(slot, x[0, :-1].tolist(), _taps(target, x[:, :-1])[0])
    sampling = SamplingParams(temperature=0.7, seed=4321, coupling="gumbel")
    rows = draft_rows(*(x[0].tolist() for x in ids), sampling=sampling)
    n = [x.shape[1] for x in ids]
    chosen, shifted = [], []

    def coupled(logits):  # [2, V] of chain step len(chosen) -> each row's coupled draft [2]
        scores, step = torch.log_softmax(logits / 0.7, -1), len(chosen)
        for out, at in ((shifted, step + 1), (chosen, step)):
            g = gumbel_noise([4321, 4321], [[n[0] + at], [n[1] + at]], logits.shape[-1])[:, 0]  # [2, V]
            out.append((scores + g).argmax(-1))
        return chosen[-1]

    logits = d.draft_chain(rows, 4, coupled)
    coupled(logits[-1])
    want = torch.stack(chosen, 1)  # [2, 4]
    assert (shifted[0] != chosen[0]).all()  # the root's children scored a position later would differ
    tree = d.propose_tree(rows, TreeConfig(nodes=4, topk=1, depth=4))
    assert tree.sizes == [4, 4] and torch.equal(tree.tokens[:, :4], want)
    assert tree.parents[:, :4].tolist() == [[0, 1, 2, 3]] * 2
    alone = d.propose_tree(rows[:1], TreeConfig(nodes=4, topk=1, depth=4))
    assert alone.sizes == [4] and torch.equal(alone.tokens[:, :4], want[:1])
    assert torch.equal(d.propose(rows, 4).tokens, want)


def test_the_k_v_held_is_what_a_position_is_said_to_cost(drafter_model):
    """Without cuda_graphs `allocate(slots, capacity)` holds the K and V of one layer (the midlayer)
    for capacity + k positions a slot (the chain's steps after a full context), no scratch:
    `kv_bytes_per_position` (what the memory check counts) of each."""
    cfg = drafter_model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_position = 2 * cfg.num_key_value_heads * head_dim * 4  # K and V, float32, one layer
    d = with_slots(Eagle3Drafter(drafter_model, 5), 3, 40)
    assert d.kv_bytes_per_position == per_position
    assert d.kv.keys.shape == d.kv.values.shape == (3, cfg.num_key_value_heads, 40 + 5, head_dim)
    held = sum(t.numel() * t.element_size() for t in (d.kv.keys, d.kv.values))
    assert held == 3 * (40 + 5) * per_position
