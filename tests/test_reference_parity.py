"""Published DFlash / DSpark checkpoints compute the reference models' function: random weights in
z-lab's and DeepSpec's layouts, loaded by trtspec, against the formulas written out here from
z-lab/dflash `dflash/model.py` (Qwen3DFlashAttention, DFlashDraftModel.forward, dflash_generate)
and deepseek-ai/DeepSpec `deepspec/modeling/dspark/` (Qwen3DSparkModel, VanillaMarkov,
AcceptRatePredictor, eval/dspark/draft_ops.py build_dspark_proposal)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from trtspec.models.dflash import load_dflash
from trtspec.models.dflash_drafter import DFlashDrafter
from trtspec.models.dspark import load_dspark
from trtspec.models.dspark_drafter import DSparkDrafter
from trtspec.models.target import load_causal_lm

from .conftest import draft_rows, with_slots

H, INTER, D, HEADS, KV_HEADS, VOCAB, MASK, TAPS, THETA = 64, 96, 16, 4, 2, 264, 258, [0, 2], 1e6


@pytest.fixture(scope="module")
def target(random_qwen3_dir):
    return load_causal_lm(random_qwen3_dir)


def _backbone_tensors(gen: torch.Generator) -> dict[str, torch.Tensor]:
    def rnd(*shape):
        return 0.2 * torch.randn(*shape, generator=gen)
    t = {"fc.weight": rnd(H, len(TAPS) * H), "hidden_norm.weight": 1 + rnd(H), "norm.weight": 1 + rnd(H)}
    for i in range(2):
        p = f"layers.{i}."
        t |= {p + "input_layernorm.weight": 1 + rnd(H), p + "post_attention_layernorm.weight": 1 + rnd(H),
              p + "self_attn.q_proj.weight": rnd(HEADS * D, H),
              p + "self_attn.k_proj.weight": rnd(KV_HEADS * D, H),
              p + "self_attn.v_proj.weight": rnd(KV_HEADS * D, H),
              p + "self_attn.o_proj.weight": rnd(H, HEADS * D),
              p + "self_attn.q_norm.weight": 1 + rnd(D), p + "self_attn.k_norm.weight": 1 + rnd(D),
              p + "mlp.gate_proj.weight": rnd(INTER, H), p + "mlp.up_proj.weight": rnd(INTER, H),
              p + "mlp.down_proj.weight": rnd(H, INTER)}
    return t


def _qwen3_fields() -> dict:
    """As a published drafter's config.json spells them (rope_theta top-level, rope_scaling null)."""
    return {"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": H, "intermediate_size": INTER,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": D, "vocab_size": VOCAB,
            "rms_norm_eps": 1e-6, "rope_theta": THETA, "rope_scaling": None, "max_position_embeddings": 512,
            "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
            "use_sliding_window": False, "sliding_window": None, "num_target_layers": 3}


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _rope(x, pos):  # x [s, d], pos [s]: rotate-half RoPE
    angle = pos[:, None].double() / THETA ** (torch.arange(0, D, 2).double() / D)
    cos, sin = torch.cat([angle, angle], -1).cos().float(), torch.cat([angle, angle], -1).sin().float()
    return x * cos + torch.cat([-x[:, D // 2 :], x[:, : D // 2]], -1) * sin


def _reference_backbone(t, taps, block_embeds, start):
    """Every layer: queries from the normed block only; keys/values from [hidden_norm(fc(taps)) ;
    normed block], k-normed, RoPE at positions 0..start−1 then start..start+B−1; no mask.
    taps [start, n·H]; block_embeds [B, H] -> final-normed hidden [B, H]"""
    ctx, h = _rms(taps @ t["fc.weight"].T, t["hidden_norm.weight"]), block_embeds
    block_pos = torch.arange(start, start + len(h))
    all_pos = torch.arange(start + len(h))
    for i in range(2):
        w = {k.removeprefix(f"layers.{i}."): v for k, v in t.items() if k.startswith(f"layers.{i}.")}
        x = _rms(h, w["input_layernorm.weight"])
        kv_in = torch.cat([ctx, x])
        heads = []
        for j in range(HEADS):
            g = j // (HEADS // KV_HEADS)  # the kv head query head j shares
            q = _rope(_rms((x @ w["self_attn.q_proj.weight"].T)[:, j * D : (j + 1) * D],
                           w["self_attn.q_norm.weight"]), block_pos)
            k = _rope(_rms((kv_in @ w["self_attn.k_proj.weight"].T)[:, g * D : (g + 1) * D],
                           w["self_attn.k_norm.weight"]), all_pos)
            v = (kv_in @ w["self_attn.v_proj.weight"].T)[:, g * D : (g + 1) * D]
            heads.append(torch.softmax(q @ k.T / math.sqrt(D), -1) @ v)
        h = h + torch.cat(heads, -1) @ w["self_attn.o_proj.weight"].T
        y = _rms(h, w["post_attention_layernorm.weight"])
        gated = torch.nn.functional.silu(y @ w["mlp.gate_proj.weight"].T) * (y @ w["mlp.up_proj.weight"].T)
        h = h + gated @ w["mlp.down_proj.weight"].T
    return _rms(h, t["norm.weight"])


def _context(target, seed: int):
    """A prompt, its anchor (the last token) and the target's taps of the tokens before it."""
    ids = torch.randint(0, 256, (1, 23), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    return ids[0].tolist(), torch.cat([hs[i + 1] for i in TAPS], -1)[0, :-1]


def test_z_lab_dflash_checkpoint_computes_z_lab_s_function(tmp_path, target):
    t = _backbone_tensors(torch.Generator().manual_seed(40))
    save_file(t, str(tmp_path / "model.safetensors"))
    config = {**_qwen3_fields(), "architectures": ["DFlashDraftModel"], "block_size": 8,
              "dflash_config": {"mask_token_id": MASK, "target_layer_ids": TAPS}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    ids, taps = _context(target, 41)
    drafter = with_slots(DFlashDrafter(load_dflash(tmp_path, target.config), target.get_input_embeddings(),
                                       target.get_output_embeddings()))
    drafter.begin(0, ids[:-1], taps)
    got = drafter.draft_logits(draft_rows(ids), 7)[0]  # [7, V]
    block = torch.tensor([ids[-1]] + [MASK] * 7)
    with torch.no_grad():
        hidden = _reference_backbone(t, taps, target.get_input_embeddings()(block), len(ids) - 1)
        expected = target.get_output_embeddings()(hidden)[1:]  # slot j predicts position start + j
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_deepspec_dspark_checkpoint_computes_deepspec_s_function(tmp_path, target):
    gen, rank, gamma = torch.Generator().manual_seed(42), 8, 6
    t = _backbone_tensors(gen) | {
        "embed_tokens.weight": torch.randn(VOCAB, H, generator=gen),
        "lm_head.weight": torch.randn(VOCAB, H, generator=gen) / 4,
        "markov_head.markov_w1.weight": torch.randn(VOCAB, rank, generator=gen),
        "markov_head.markov_w2.weight": torch.randn(VOCAB, rank, generator=gen),
        "confidence_head.proj.weight": torch.randn(1, H + rank, generator=gen) / 4,
        "confidence_head.proj.bias": torch.randn(1, generator=gen)}
    save_file(t, str(tmp_path / "model.safetensors"))
    config = {**_qwen3_fields(), "architectures": ["Qwen3DSparkModel"], "block_size": gamma,
              "mask_token_id": MASK, "target_layer_ids": TAPS, "num_anchors": 512, "markov_rank": rank,
              "markov_head_type": "vanilla", "enable_confidence_head": True,
              "confidence_head_with_markov": True, "layer_types": ["full_attention"] * 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    ids, taps = _context(target, 43)
    drafter = with_slots(DSparkDrafter(load_dspark(tmp_path, target.config)))
    drafter.begin(0, ids[:-1], taps)
    got = drafter.propose(draft_rows(ids), gamma)
    block = torch.tensor([ids[-1]] + [MASK] * (gamma - 1))
    with torch.no_grad():  # the anchor's slot predicts x_1; greedy drafts left to right
        hidden = _reference_backbone(t, taps, t["embed_tokens.weight"][block], len(ids) - 1)
        base = hidden @ t["lm_head.weight"].T
        prev, tokens, conf = ids[-1], [], []
        for k in range(gamma):
            e = t["markov_head.markov_w1.weight"][prev]
            z = torch.cat([hidden[k], e]) @ t["confidence_head.proj.weight"][0]  # [h_k ; W1[x_{k−1}]]
            conf.append(torch.sigmoid(z + t["confidence_head.proj.bias"][0]))
            prev = int((base[k] + e @ t["markov_head.markov_w2.weight"].T).argmax())
            tokens.append(prev)
    assert got.tokens[0].tolist() == tokens
    torch.testing.assert_close(got.confidence[0], torch.stack(conf), atol=1e-5, rtol=1e-4)
