"""Distil a DSpark drafter (backbone + Markov head + confidence head) from a target.

Data, batches and anchors are DFlash's (`train.dflash`: greedy regeneration by the target,
teacher-forced taps, each sequence once per epoch in a fresh order, packed blocks under
`block_mask`), plus the target's logits at every position, so the
target distribution p_t of every draft slot is known. Block of anchor a: `[x_a, MASK × (γ−1)]`
at positions a..a+γ−1; slot k = 1..γ predicts x_{a+k}, whose target distribution is the target's
output at position a+k−1 — exactly the block's own positions.

Loss (DeepSpec `compute_dspark_loss`), each term a weighted mean with `w_k = exp(−(k−1)/γ_d)`:
  0.1·CE(p_k, x_{a+k}) + 0.9·TV(p_k, p_t) + 1.0·BCE(c_k, c*_k),  c*_k = 1 − ½‖p_k − p_t‖₁ (detached)
with the Markov input teacher-forced (x_{k−1} = the target's own token; the RNN head's state
unrolled over the block on those tokens, as DeepSpec's `RNNHead.apply_block_logits` does).
DeepSpec's `l1_loss` is the unhalved ‖p_k − p_t‖₁; this recipe uses TV = ½‖·‖₁ as the DSpark
paper writes it (set `tv_alpha=1.8` to reproduce DeepSpec's weighting exactly).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from trtspec.files import write_text
from trtspec.models.dflash import build_target_layer_ids
from trtspec.models.dspark import DSparkDraftModel, DSparkSpec, save_dspark
from trtspec.train import check_loss
from trtspec.train.dflash import (
    DEFAULT_GAMMA,
    MAX_EPOCHS,
    _lr_at,
    anchor_range,
    block_drafter_start,
    block_labels,
    block_mask,
    init_layers_from_target,
    resume_state,
    sample_anchors,
    save_state,
    target_taps,
)
from trtspec.train.order import EpochOrder

log = logging.getLogger(__name__)


class DSparkTrainConfig(BaseModel):
    """Hyper-parameters of DSpark distillation (defaults sized for the embedded tiny target)."""

    model_config = ConfigDict(allow_inf_nan=False)  # --epochs inf was an OverflowError traceback

    block_size: int = Field(15, ge=1, le=256, description="γ: drafts per block (= block inputs); 15 verifies "
                            "16 tokens per cycle, like the shipped DFlash b16")
    num_layers: int = Field(2, ge=1, description="drafter decoder layers")
    target_layer_ids: list[int] | None = Field(None, description="taps; default: z-lab's spread")
    markov_rank: int = Field(256, ge=0, le=8192,
                             description="r of the Markov head W1: V×r, W2: r×V; 0 = none")
    markov_head_type: Literal["vanilla", "gated", "rnn"] = Field(
        "vanilla", description="DeepSpec's Markov head: vanilla (bias from x_{k−1}), gated (W1[x_{k−1}] "
        "gated by h_k) or rnn (a recurrent state over the block's prefix); trtspec.models.markov")
    response_tokens: int = Field(192, ge=8, description="tokens the target regenerates per prompt")
    anchors_per_seq: int = Field(32, ge=1, description="blocks trained per sequence per step")
    batch_size: int = Field(8, ge=1, description="sequences per step")
    epochs: float = Field(4.0, gt=0, le=MAX_EPOCHS,
                          description="passes over the regenerated data, each sequence once per pass in a "
                                      "fresh order")
    max_steps: int | None = Field(None, ge=1, description="stop after this many steps (short runs)")
    lr: float = Field(1e-3, gt=0, description="peak AdamW learning rate")
    warmup: float = Field(0.04, ge=0, le=1, description="fraction of steps of warm-up")
    gamma: float | None = Field(None, gt=0, description="loss decay γ_d; default 4 for γ=7, 7 for γ=15")
    ce_alpha: float = Field(0.1, ge=0, description="weight of the cross-entropy to the target's token")
    tv_alpha: float = Field(0.9, ge=0, description="weight of TV(p_k, p_t)")
    confidence_alpha: float = Field(1.0, ge=0, description="weight of the confidence BCE; 0 = no head")
    init_from_target: bool = Field(True, description="start drafter layer i from target layer i "
                                   "(layers past the target's depth start at random)")
    checkpoint_every: int = Field(200, ge=1, description="steps between resumable checkpoints")
    seed: int = Field(0, description="seed of initialisation, anchors and the per-epoch example order")

    def decay(self) -> float:
        # DeepSpec: γ_d = 4 for block 7 (verify width 8), as DFlash's table gives for B = 8
        width = self.block_size + 1
        return self.gamma or DEFAULT_GAMMA.get(width, width / 2.3)


@dataclass(slots=True)
class DSparkBatch:
    """A packed forward over n blocks per sequence."""

    hidden: torch.Tensor  # [b, n, γ, H] backbone outputs h_1..h_γ
    labels: torch.Tensor  # [b, n, γ] x_{a+1}..x_{a+γ} (the target's tokens)
    prev: torch.Tensor  # [b, n, γ] teacher-forced x_{a}..x_{a+γ−1}
    positions: torch.Tensor  # [b, n, γ] a..a+γ−1: where the target predicts each label
    valid: torch.Tensor  # [b, n, γ] the label exists (False past the end of the response)


def block_forward(model: DSparkDraftModel, seqs: torch.Tensor, taps: torch.Tensor,
                  anchors: torch.Tensor, lens: torch.Tensor | None = None) -> DSparkBatch:
    """seqs [b, S]; taps [b, S, n_taps*H]; anchors [b, n] (each ≤ valid_len − 2); lens [b] valid
    lengths (None: all S): slots whose label lies past them are marked not valid (`block_labels`)."""
    b, seq_len = seqs.shape
    n, gamma = anchors.shape[1], model.spec.block_size
    pos = anchors[..., None] + torch.arange(gamma)  # [b, n, γ]
    ids = torch.full_like(pos, model.spec.mask_token_id)
    ids[..., 0] = seqs.gather(1, anchors)
    ctx_kv = model.project_context(taps, torch.arange(seq_len).expand(b, -1))
    mask = block_mask(anchors, seq_len, gamma)
    hidden = model(model.embed_tokens(ids.flatten(1)), pos.flatten(1), ctx_kv, mask)
    labels, valid = block_labels(seqs, lens, pos + 1)
    prev = torch.cat([ids[..., :1], labels[..., :-1]], -1)  # x_a, then the label before each slot
    return DSparkBatch(hidden.view(b, n, gamma, -1), labels, prev, pos, valid)


def dspark_loss(model: DSparkDraftModel, batch: DSparkBatch, target_logits: torch.Tensor,
                cfg: DSparkTrainConfig) -> tuple[torch.Tensor, dict]:
    """target_logits [b, n, γ, V]: p_t of each slot. Returns (loss, metrics)."""
    logits, conf_logits = model.teacher_forced(batch.hidden, batch.prev)  # [b, n, γ, V], [b, n, γ]
    gamma = logits.shape[2]
    w = torch.exp(-torch.arange(gamma, dtype=torch.float32) / cfg.decay())  # w_k, k = 1..γ
    w = w * batch.valid  # [b, n, γ]: no weight where no label exists
    wsum = w.sum()
    ce = F.cross_entropy(logits.flatten(0, 2).float(), batch.labels.flatten(), reduction="none")
    p_d = torch.softmax(logits.float(), -1)
    p_t = torch.softmax(target_logits.float(), -1)
    tv = 0.5 * (p_d - p_t).abs().sum(-1)  # [b, n, γ]
    loss = cfg.ce_alpha * (ce.view_as(w) * w).sum() / wsum + cfg.tv_alpha * (tv * w).sum() / wsum
    c_star = (1.0 - tv).detach().clamp(0.0, 1.0)
    metrics = {}
    if conf_logits is not None and cfg.confidence_alpha > 0:
        bce = F.binary_cross_entropy_with_logits(conf_logits, c_star, reduction="none")
        loss = loss + cfg.confidence_alpha * (bce * w).sum() / wsum
        metrics["conf_err"] = (torch.sigmoid(conf_logits) - c_star).abs().mean().item()
    with torch.no_grad():
        # expected tokens per cycle under temperature-1 sampling: 1 + Σ_j ∏_{i≤j} c*_i
        metrics["tau_prob"] = 1 + (c_star * batch.valid).cumprod(-1).sum(-1).mean().item()
        hits = (logits.argmax(-1) == batch.labels) & batch.valid
        metrics["acc"] = hits.sum((0, 1)) / batch.valid.sum((0, 1)).clamp(min=1)  # [γ]
    return loss, metrics


def new_dspark(target, mask_token_id: int, cfg: DSparkTrainConfig) -> DSparkDraftModel:
    """A fresh drafter whose embedding and LM head are frozen copies of the target's."""
    tc = target.config
    layer_ids = cfg.target_layer_ids or build_target_layer_ids(tc.num_hidden_layers, cfg.num_layers)
    spec = DSparkSpec(cfg.block_size, mask_token_id, layer_ids, tc.num_hidden_layers,
                      markov_rank=cfg.markov_rank, markov_head_type=cfg.markov_head_type,
                      enable_confidence_head=cfg.confidence_alpha > 0,
                      confidence_head_with_markov=cfg.confidence_alpha > 0 and cfg.markov_rank > 0,
                      num_anchors=cfg.anchors_per_seq)
    fields = {k: v for k, v in tc.to_dict().items() if k not in ("layer_types", "max_window_layers")}
    config = type(tc).from_dict({**fields, "num_hidden_layers": cfg.num_layers, "tie_word_embeddings": False})
    model = DSparkDraftModel(config, spec)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        model.lm_head.weight.copy_(target.get_output_embeddings().weight)
        if model.markov_head is not None:
            # W2 = 0: training starts from the plain backbone distribution
            model.markov_head.markov_w2.weight.zero_()
    model.embed_tokens.requires_grad_(False)
    model.lm_head.requires_grad_(False)
    if cfg.init_from_target:
        init_layers_from_target(model.layers, target)
    return model


@torch.inference_mode()
def target_logits_all(model, seqs: torch.Tensor, batch: int = 32) -> torch.Tensor:
    """Teacher-forced target logits of every position (fp16 to halve memory).  [N, S] -> [N, S, V]"""
    out = [model(seqs[i : i + batch]).logits.half() for i in tqdm(range(0, len(seqs), batch),
                                                                  desc="target logits", unit="batch")]
    return torch.cat(out)


def train_dspark(target_dir: Path, prompts_path: Path, out_dir: Path, cfg: DSparkTrainConfig,
                 mask_token_id: int | None = None) -> dict:
    target, mask_token_id, data = block_drafter_start(target_dir, prompts_path, out_dir, cfg, mask_token_id)
    model = new_dspark(target, mask_token_id, cfg)
    taps = target_taps(target, data["seqs"], model.spec.target_layer_ids)
    p_logits = target_logits_all(target, data["seqs"])  # [N, S, V]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    num = len(data["seqs"])
    lo, hi, usable = anchor_range(data, cfg.block_size)  # slot k of γ predicts x_{a+k}
    total = max(1, int(cfg.epochs * len(usable) / cfg.batch_size))  # an epoch: each usable sequence once
    stop = min(total, cfg.max_steps or total)
    gen = torch.Generator().manual_seed(cfg.seed)
    order = EpochOrder(usable, gen)
    state_file = out_dir / "checkpoint" / "state.pt"
    start, history = resume_state(state_file, model, opt, gen, "DSpark", stop, cfg, order)

    t0 = time.time()
    bar = tqdm(range(start, stop), desc="train dspark", unit="step", initial=start, total=stop)
    for step in bar:
        rows = order.take(cfg.batch_size)  # [b]
        anchors = sample_anchors(rows, lo, hi, cfg.anchors_per_seq, gen)  # [b, n]
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, total, cfg)
        batch = block_forward(model, data["seqs"][rows], taps[rows], anchors, data["lens"][rows])
        flat = batch.positions.flatten(1).clamp(max=p_logits.shape[1] - 1)  # [b, n*γ]; past it: not valid
        p_t = p_logits[rows[:, None], flat].view(*batch.positions.shape, -1)  # [b, n, γ, V]
        loss, metrics = dspark_loss(model, batch, p_t, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tau_greedy = 1 + metrics["acc"].cumprod(0).sum().item()
        check_loss(loss.item(), step + 1)
        bar.set_postfix(loss=f"{loss.item():.3f}", tau_prob=f"{metrics['tau_prob']:.2f}",
                        tau_est=f"{tau_greedy:.2f}")
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == stop:
            history.append({"step": step + 1, "loss": round(loss.item(), 4), "tau_est": round(tau_greedy, 3),
                            "tau_prob": round(metrics["tau_prob"], 3),
                            "conf_err": round(metrics.get("conf_err", float("nan")), 4),
                            "seconds": round(time.time() - t0, 1)})
            save_dspark(model, out_dir)  # before the state, which must not run ahead of it
            save_state(state_file, model, opt, gen, step + 1, cfg, history, order)
    report = {"recipe": cfg.model_dump(), "target": str(target_dir), "prompts": str(prompts_path),
              "sequences": num, "history": history}
    write_text(out_dir / "training.json", json.dumps(report, indent=1))
    return report
