"""Train an EAGLE-3 drafter for any target, with training-time test (arXiv 2503.01840 §3).

1. Regenerate: the target continues every training prompt greedily (`train.dflash.regenerate`).
2. Features: one teacher-forced target pass gives the low/mid/high taps and, from the last
   layer, the target's distribution p at every position (the soft labels).
3. Draft vocabulary: the `draft_vocab_size` most frequent response tokens (`d2t`/`t2d`).
4. Training-time test, `ttt_steps` unrolled steps over every slot j of a sequence at once.
   Step 0 reads the fused target feature g_j and token j+1; step i ≥ 1 reads the drafter's own
   output of step i−1 at slot j and token j+1+i, at position j+i, and attends to step 0's keys
   of slots ≤ j plus its own slot's keys of steps 1..i — exactly what chain drafting from slot j
   sees at inference. Step i predicts token j+2+i.
5. Loss: Σ_i 0.8^i · CE(p restricted to the draft vocabulary, q) over response tokens whose
   target argmax the draft vocabulary holds (EAGLE-3's weighting), normalised by Σ_i 0.8^i.
   `embed_tokens` is the target's, frozen; `fc`, the midlayer, `norm` and `lm_head` train.
Batches go through the sequences once per epoch, in a fresh random order (`train.order`).
Checkpoints are written in the SafeAILab/SpecForge layout; `checkpoint/` makes the run resumable.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm
from transformers import LlamaConfig

from trtspec.errors import OptionError, TrtspecError
from trtspec.files import write_text
from trtspec.models.eagle3 import Eagle3DraftModel, Eagle3Spec, default_aux_layer_ids, save_eagle3
from trtspec.train import check_loss
from trtspec.train.dflash import (
    MAX_EPOCHS,
    _lr_at,
    check_layer_ids,
    frozen_target,
    resume_state,
    save_state,
    target_taps,
)
from trtspec.train.order import EpochOrder
from trtspec.train.prompts import regenerated_data

log = logging.getLogger(__name__)

MAX_TTT_STEPS = 64  # training-time-test steps, at most (EAGLE-3 trains with 7; 100,000 never ended)


class Eagle3TrainConfig(BaseModel):
    """Hyper-parameters of EAGLE-3 training."""

    model_config = ConfigDict(allow_inf_nan=False)  # --epochs inf was an OverflowError traceback

    ttt_steps: int = Field(7, ge=1, le=MAX_TTT_STEPS,
                           description="training-time-test steps unrolled per slot")
    step_decay: float = Field(0.8, gt=0, le=1, description="loss weight of TTT step i is decay**i")
    draft_vocab_size: int | None = Field(None, ge=1, description="reduced draft vocabulary; None = target's")
    aux_layer_ids: list[int] | None = Field(
        None, description="low/mid/high taps; default [1, L//2−1, L−4]; distinct ones on shallow targets"
    )
    response_tokens: int = Field(192, ge=8, description="tokens the target regenerates per prompt")
    batch_size: int = Field(8, ge=1, description="sequences per step")
    epochs: float = Field(2.0, gt=0, le=MAX_EPOCHS,
                          description="passes over the regenerated data, each sequence once per pass in a "
                                      "fresh order")
    lr: float = Field(1e-3, gt=0, description="peak AdamW learning rate")
    warmup: float = Field(0.04, ge=0, le=1, description="fraction of steps of warm-up")
    checkpoint_every: int = Field(200, ge=1, description="steps between resumable checkpoints")
    max_steps: int | None = Field(None, ge=1, description="stop after this many steps (short runs)")
    seed: int = Field(0, description="seed of initialisation and the per-epoch example order")


def choose_aux_layer_ids(num_layers: int) -> list[int]:
    """The published default; a shallow target where it repeats a layer gets distinct taps."""
    for ids in (default_aux_layer_ids(num_layers), [1, num_layers // 2, num_layers - 2],
                [0, num_layers // 2, num_layers - 1]):
        if len(set(ids)) == 3 and min(ids) >= 0:
            return ids
    raise TrtspecError(f"EAGLE-3 needs a target with at least 3 layers, this one has {num_layers}")


def select_draft_vocab(seqs, lens, prompt_lens, vocab_size: int, size: int | None):
    """The `size` most frequent response tokens. Returns (d2t [size], t2d [vocab]) where
    draft id d stands for target id d + d2t[d] (ascending target ids)."""
    if size is None or size >= vocab_size:
        return torch.zeros(vocab_size, dtype=torch.long), torch.ones(vocab_size, dtype=torch.bool)
    pos = torch.arange(seqs.shape[1])
    in_response = (pos >= prompt_lens[:, None]) & (pos < lens[:, None])  # [N, S]
    counts = torch.bincount(seqs[in_response], minlength=vocab_size)
    order = torch.sort(-counts, stable=True).indices  # most frequent first, ties by id
    kept = torch.sort(order[:size]).values  # [size] target ids
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[kept] = True
    return kept - torch.arange(size), t2d


def new_drafter(target, cfg: Eagle3TrainConfig) -> Eagle3DraftModel:
    tc = target.config
    vocab = tc.vocab_size
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
        num_hidden_layers=1, num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads, head_dim=tc.head_dim, hidden_act=tc.hidden_act,
        max_position_embeddings=tc.max_position_embeddings, rms_norm_eps=tc.rms_norm_eps,
        rope_parameters=dict(tc.rope_parameters), attention_bias=False, tie_word_embeddings=False,
        bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id, pad_token_id=tc.pad_token_id,
    )
    ids = cfg.aux_layer_ids or choose_aux_layer_ids(tc.num_hidden_layers)
    spec = Eagle3Spec(min(cfg.draft_vocab_size or vocab, vocab), tc.hidden_size, ids)
    return Eagle3DraftModel(config, spec)


def ttt_mask(num_slots: int, step: int) -> torch.Tensor:
    """Step `step` queries over the keys of steps 0..step: causal over step 0, own slot after.
    -> boolean [1, 1, T, (step + 1)·T]"""
    slots = torch.arange(num_slots)
    blocks = [slots[None, :] <= slots[:, None]] + [torch.eye(num_slots, dtype=torch.bool)] * step
    return torch.cat(blocks, -1)[None, None]


def _shift(x: torch.Tensor, by: int, length: int) -> torch.Tensor:
    """x[:, by : by + length] along dim 1, zero-padded past the end.  [b, S, ...] -> [b, length, ...]"""
    out = x.new_zeros((x.shape[0], length, *x.shape[2:]))
    part = x[:, by : by + length]
    out[:, : part.shape[1]] = part
    return out


def ttt_forward(model: Eagle3DraftModel, seqs, aux, steps: int):
    """Yield the midlayer output h [b, T, H] of TTT steps 0..steps−1 at every slot j < T = S − 1.
    seqs [b, S]; aux [b, S, 3·Ht]."""
    b, seq_len = seqs.shape
    num_slots = seq_len - 1  # slot j needs token j+1
    hidden = model.fuse(aux[:, :num_slots])  # g [b, T, H]
    keys, values = [], []
    for i in range(steps):
        ids = _shift(seqs, 1 + i, num_slots)  # token j+1+i  [b, T]
        positions = (torch.arange(num_slots) + i).expand(b, -1)
        past = None if i == 0 else (torch.cat(keys, 2), torch.cat(values, 2))
        hidden, (k, v) = model(ids, hidden, positions, past, ttt_mask(num_slots, i))
        keys.append(k)
        values.append(v)
        yield hidden


def eagle3_ttt_loss(model: Eagle3DraftModel, seqs, aux, target_logits, loss_mask, steps: int, decay: float):
    """TTT loss over every slot.  seqs [b, S]; aux [b, S, 3·Ht] taps; target_logits [b, S, V]
    (position t's logits = p of token t+1); loss_mask [b, S] (True where token t counts).
    A label counts where its token counts and its p's argmax is in the draft vocabulary.
    Returns (loss, acc [steps])."""
    b, seq_len = seqs.shape
    num_slots = seq_len - 1  # slot j needs token j+1
    draft_to_target = model.to_target_ids(torch.arange(model.spec.draft_vocab_size))
    in_vocab = model.t2d[target_logits.argmax(-1)]  # [b, S] p of position t (token t+1) fits
    p = torch.softmax(target_logits[..., draft_to_target].float(), -1)  # [b, S, Vd]

    losses, accs, weights = [], [], []
    for i, hidden in enumerate(ttt_forward(model, seqs, aux, steps)):
        logq = torch.log_softmax(model.draft_logits(hidden).float(), -1)  # [b, T, Vd]
        p_i = _shift(p, 1 + i, num_slots)  # p of token j+2+i  [b, T, Vd]
        # token j+2+i counts, and p_i (position j+1+i) has its argmax in the draft vocabulary
        mask = _shift(loss_mask, 2 + i, num_slots) & _shift(in_vocab, 1 + i, num_slots)  # [b, T]
        count = mask.sum().clamp(min=1)
        losses.append(-((p_i * logq).sum(-1) * mask).sum() / count)
        with torch.no_grad():
            accs.append(((logq.argmax(-1) == p_i.argmax(-1)) & mask).sum() / count)
        weights.append(decay**i)
    loss = sum(w * x for w, x in zip(weights, losses, strict=True)) / sum(weights)
    return loss, torch.stack(accs)


def _features(target, seqs: torch.Tensor, layer_ids: list[int], chunk: int = 256) -> torch.Tensor:
    """Taps of `layer_ids` and of the last layer, kept in bfloat16.  -> [N, S, 4·H]
    The last layer's tap is the final-normed state (`models.taps`), what the LM head reads."""
    last = target.config.num_hidden_layers - 1
    return torch.cat([target_taps(target, seqs[i : i + chunk], [*layer_ids, last]).bfloat16()
                      for i in range(0, len(seqs), chunk)])


@torch.no_grad()
def soft_label_logits(target, feats: torch.Tensor) -> torch.Tensor:
    """The target's logits at every position from `_features`' last tap, which is already
    final-normed: the LM head alone, no second norm.  feats [b, S, 4·H] -> [b, S, V]"""
    return target.get_output_embeddings()(feats[..., 3 * target.config.hidden_size :])


def train_eagle3(target_dir: Path, prompts_path: Path, out_dir: Path, cfg: Eagle3TrainConfig) -> dict:
    target = frozen_target(target_dir, cfg.seed)
    num_layers, hidden_size = target.config.num_hidden_layers, target.config.hidden_size
    check_layer_ids(cfg.aux_layer_ids, num_layers, "--aux-layer-ids", count=3)
    vocab = target.config.vocab_size
    if cfg.draft_vocab_size is not None and cfg.draft_vocab_size > vocab:
        raise OptionError("--draft-vocab-size", f"{cfg.draft_vocab_size} exceeds the target's vocabulary of "
                                                f"{vocab}")
    checkpoint = out_dir / "checkpoint"
    data = regenerated_data(target, target_dir, prompts_path, cfg.response_tokens, checkpoint / "data.pt",
                            trained_on=(checkpoint / "state.pt").is_file())

    model = new_drafter(target, cfg)
    with torch.no_grad():
        d2t, t2d = select_draft_vocab(data["seqs"], data["lens"], data["prompt_lens"],
                                      target.config.vocab_size, cfg.draft_vocab_size)
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
        model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        model.lm_head.weight.copy_(target.get_output_embeddings().weight[model.to_target_ids(
            torch.arange(model.spec.draft_vocab_size))])
    model.embed_tokens.weight.requires_grad_(False)
    feats = _features(target, data["seqs"], model.spec.aux_layer_ids)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    num = len(data["seqs"])
    total = max(1, int(cfg.epochs * num / cfg.batch_size))
    stop = min(total, cfg.max_steps or total)
    gen = torch.Generator().manual_seed(cfg.seed)
    order = EpochOrder(torch.arange(num), gen)
    state_file = out_dir / "checkpoint" / "state.pt"
    start, history = resume_state(state_file, model, opt, gen, "EAGLE-3", stop, cfg, order)

    positions = torch.arange(data["seqs"].shape[1])
    t0 = time.time()
    bar = tqdm(range(start, stop), desc="train eagle3", unit="step", initial=start, total=stop)
    for step in bar:
        rows = order.take(cfg.batch_size)  # [b]
        width = int(data["lens"][rows].max())
        seqs = data["seqs"][rows, :width]
        f = feats[rows, :width].float()
        target_logits = soft_label_logits(target, f)  # [b, S, V]
        loss_mask = ((positions[:width] >= data["prompt_lens"][rows, None])
                     & (positions[:width] < data["lens"][rows, None]))
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, total, cfg)
        loss, acc = eagle3_ttt_loss(model, seqs, f[..., : 3 * hidden_size], target_logits, loss_mask,
                                    cfg.ttt_steps, cfg.step_decay)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        # drafts accepted per chain if steps were independent: sum of prefix products, + bonus
        tau_est = 1 + acc.cumprod(0).sum().item()
        check_loss(loss.item(), step + 1)
        bar.set_postfix(loss=f"{loss.item():.3f}", acc0=f"{acc[0].item():.2f}", tau_est=f"{tau_est:.2f}")
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == stop:
            history.append({"step": step + 1, "loss": round(loss.item(), 4), "tau_est": round(tau_est, 3),
                            "acc": [round(a, 3) for a in acc.tolist()],
                            "seconds": round(time.time() - t0, 1)})
            save_eagle3(model, out_dir, num_layers)  # before the state, which must not run ahead of it
            save_state(state_file, model, opt, gen, step + 1, cfg, history, order)
    report = {"recipe": cfg.model_dump(), "target": str(target_dir), "prompts": str(prompts_path),
              "sequences": num, "total_steps": total, "history": history}
    write_text(out_dir / "training.json", json.dumps(report, indent=1))
    return report
