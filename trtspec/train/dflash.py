"""Distil a DFlash drafter for any target (the recipe the official repo does not ship).

1. Regenerate: the target continues every training prompt greedily, so the drafter learns the
   target's own outputs rather than the corpus.
2. Features: one teacher-forced target pass per sequence gives the taps at `target_layer_ids`.
3. Batches and anchors: each epoch goes through the sequences once, in a fresh random order
   (`train.order`); anchors are random positions in each response; block j of an anchor a is
   `[x_a, MASK × (B−1)]` at positions a..a+B−1 and sees the context strictly before a plus its
   own block (bidirectionally); slot k predicts x_{a+k} (no shift). A block that runs past the
   response's end is trained on the slots before it (`block_labels`).
4. Loss: cross-entropy weighted per slot `w_k = exp(−(k−1)/γ)`; only the drafter layers, `fc`
   and the norms train — the target's embedding and LM head are shared and frozen.
Checkpoints are written in z-lab's layout; `checkpoint/` beside them makes the run resumable.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from trtspec.errors import OptionError, TrtspecError
from trtspec.files import replaced, write_text
from trtspec.models.dflash import DFlashDraftModel, DFlashSpec, build_target_layer_ids, save_dflash
from trtspec.models.taps import LayerTaps
from trtspec.models.target import load_causal_lm
from trtspec.train import check_loss
from trtspec.train.order import EpochOrder
from trtspec.train.prompts import load_run_file, regenerated_data

log = logging.getLogger(__name__)

DEFAULT_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}  # the paper's decay per block size

MAX_EPOCHS = 1000  # passes over the data, at most (1e300 passed `> 0` and meant forever)


class DFlashTrainConfig(BaseModel):
    """Hyper-parameters of DFlash distillation."""

    model_config = ConfigDict(allow_inf_nan=False)  # --epochs inf was an OverflowError traceback

    block_size: int = Field(16, ge=2, le=256, description="B: block tokens (anchor + B−1 drafts)")
    num_layers: int = Field(2, ge=1, description="drafter decoder layers")
    target_layer_ids: list[int] | None = Field(None, description="taps; default: z-lab's spread")
    response_tokens: int = Field(192, ge=8, description="tokens the target regenerates per prompt")
    anchors_per_seq: int = Field(32, ge=1, description="blocks trained per sequence per step")
    batch_size: int = Field(8, ge=1, description="sequences per step")
    epochs: float = Field(6.0, gt=0, le=MAX_EPOCHS,
                          description="passes over the regenerated data, each sequence once per pass in a "
                                      "fresh order")
    max_steps: int | None = Field(None, ge=1, description="stop after this many steps (short runs)")
    lr: float = Field(6e-4, gt=0, description="peak AdamW learning rate")
    warmup: float = Field(0.04, ge=0, le=1, description="fraction of steps of warm-up")
    gamma: float | None = Field(None, gt=0, description="loss decay; default 7/5/4 for B=16/10/8")
    init_from_target: bool = Field(True, description="start drafter layer i from target layer i "
                                   "(layers past the target's depth start at random)")
    checkpoint_every: int = Field(200, ge=1, description="steps between resumable checkpoints")
    seed: int = Field(0, description="seed of initialisation, anchors and the per-epoch example order")

    def decay(self) -> float:
        return self.gamma or DEFAULT_GAMMA.get(self.block_size, self.block_size / 2.3)


@torch.no_grad()
def target_taps(model, seqs: torch.Tensor, layer_ids: list[int], batch: int = 32) -> torch.Tensor:
    """Teacher-forced taps of every position (as the serving target catches them, `models.taps`).
    seqs [N, S] -> [N, S, n_taps*H]"""
    taps, out = LayerTaps.for_model(model, tuple(layer_ids)), []
    for i in tqdm(range(0, len(seqs), batch), desc="target features", unit="batch"):
        with taps.catching() as caught:
            model(seqs[i : i + batch])
        out.append(LayerTaps.concat(caught))
    return torch.cat(out)


def block_mask(anchors: torch.Tensor, ctx_len: int, block: int) -> torch.Tensor:
    """Boolean attention mask for training.  anchors [b, n] -> [b, 1, n*B, S + n*B]

    A query of block j sees context positions < anchor_j and every slot of block j."""
    b, n = anchors.shape
    q_block = torch.arange(n).repeat_interleave(block)  # [n*B]
    ctx = torch.arange(ctx_len)[None, None, :] < anchors[:, q_block, None]  # [b, n*B, S]
    own = (q_block[:, None] == q_block[None, :]).expand(b, -1, -1)  # [b, n*B, n*B]
    return torch.cat([ctx, own], -1)[:, None]


def block_labels(seqs: torch.Tensor, lens: torch.Tensor | None, pos: torch.Tensor):
    """The tokens at block positions and which of them exist: a block that runs past its
    sequence's valid tokens (`lens`; None: all of `seqs`) is trained on the part before the end,
    as SpecForge and DeepSpec mask it, so the drafter learns to draft a response's last tokens.
    seqs [b, S]; pos [b, n, k] -> (tokens [b, n, k] (a valid token where none exists), valid [b, n, k])"""
    b, seq_len = seqs.shape
    end = torch.full((b,), seq_len) if lens is None else lens.clamp(max=seq_len)
    valid = pos < end[:, None, None]
    tokens = seqs.gather(1, pos.clamp(max=seq_len - 1).flatten(1)).view(pos.shape)
    return tokens, valid


def dflash_loss(model: DFlashDraftModel, embed, lm_head, seqs, taps, anchors, gamma: float,
                lens: torch.Tensor | None = None):
    """Position-weighted CE of the drafter on blocks at `anchors`, over the labels that exist.
    seqs [b, S]; taps [b, S, D]; anchors [b, n] (each <= valid_len − 2); lens [b] valid lengths
    (None: all S). Returns (loss, acc [B−1])."""
    b, seq_len = seqs.shape
    block = model.spec.block_size
    offsets = torch.arange(block)
    pos = anchors[..., None] + offsets  # [b, n, B]
    ids = torch.full_like(pos, model.spec.mask_token_id)
    ids[..., 0] = seqs.gather(1, anchors)
    labels, valid = block_labels(seqs, lens, pos[..., 1:])  # [b, n, B−1] each

    ctx_kv = model.project_context(taps, torch.arange(seq_len).expand(b, -1))
    hidden = model(embed(ids.flatten(1)), pos.flatten(1), ctx_kv, block_mask(anchors, seq_len, block))
    hidden = hidden.view(b, -1, block, hidden.shape[-1])[:, :, 1:]  # [b, n, B−1, H]
    logits = lm_head(hidden)
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view(labels.shape)
    weights = torch.exp(-(offsets[1:].float() - 1) / gamma) * valid  # w_k, k = 1..B−1, where a label is
    loss = (ce * weights).sum() / weights.sum()
    with torch.no_grad():
        acc = ((logits.argmax(-1) == labels) & valid).sum((0, 1)) / valid.sum((0, 1)).clamp(min=1)
    return loss, acc


def _lr_at(step: int, total: int, cfg: DFlashTrainConfig) -> float:
    warm = max(1, int(cfg.warmup * total))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def check_layer_ids(layer_ids: list[int] | None, num_layers: int, option: str = "--target-layer-ids",
                    count: int | None = None) -> None:
    """Refuse taps outside the target, before any model is built, and taps out of ascending order:
    a serving engine may catch a tap as its layer loop passes it (vLLM's models append one when
    `idx in self.aux_hidden_state_layers`), concatenating the taps in layer order whatever order the
    drafter's config lists, so a drafter trained on another order would be fed its features shuffled.
    count: how many taps the drafter needs (EAGLE-3: 3), if fixed."""
    if layer_ids is None:
        return
    outside = any(not 0 <= i < num_layers for i in layer_ids)
    if not layer_ids or outside or (count and len(layer_ids) != count):
        need = f"{count} layers" if count else "layers"
        raise OptionError(option, f"must be {need} in [0, {num_layers}) of the target, got {layer_ids}")
    if layer_ids != sorted(set(layer_ids)):
        raise OptionError(option, f"must name each layer once, in ascending order (a serving engine may "
                                  f"concatenate the taps in layer order), got {layer_ids}")


def new_drafter(target, mask_token_id: int, cfg: DFlashTrainConfig) -> DFlashDraftModel:
    tc = target.config
    layer_ids = cfg.target_layer_ids or build_target_layer_ids(tc.num_hidden_layers, cfg.num_layers)
    spec = DFlashSpec(cfg.block_size, mask_token_id, layer_ids, tc.num_hidden_layers)
    fields = {k: v for k, v in tc.to_dict().items() if k not in ("layer_types", "max_window_layers")}
    config = type(tc).from_dict({**fields, "num_hidden_layers": cfg.num_layers})
    model = DFlashDraftModel(config, spec)
    if cfg.init_from_target:
        init_layers_from_target(model.layers, target)
    return model


def init_layers_from_target(layers, target) -> None:
    """Drafter layer i starts as target layer i; layers past the target's depth keep their random
    start (`--layers` above the target's layer count was an IndexError after regenerating)."""
    for mine, theirs in zip(layers, target.model.layers, strict=False):
        mine.load_state_dict(theirs.state_dict(), strict=False)


def resolve_mask_token(target, target_dir: Path, mask_token_id: int | None) -> int:
    """The mask id: given, or the one the target's config names among its special tokens."""
    specials = getattr(target.config, "trtspec_special_tokens", {}) or {}
    mask_token_id = mask_token_id if mask_token_id is not None else specials.get("mask")
    if mask_token_id is None:
        raise TrtspecError(f"{target_dir}/config.json names no mask token: pass --mask-token-id")
    if not 0 <= mask_token_id < target.config.vocab_size:
        raise OptionError("--mask-token-id", f"{mask_token_id} is not in the target's vocabulary "
                                             f"[0, {target.config.vocab_size})")
    return mask_token_id


# what a resumed run may change: how long it trains and how often it saves
RESUMABLE = frozenset({"epochs", "max_steps", "checkpoint_every"})


def resumable_recipe(cfg) -> dict:
    """The train config fields a resumed run must repeat (the rest of `cfg`, as JSON)."""
    return cfg.model_dump(mode="json", exclude=set(RESUMABLE))


def resume_state(state_file: Path, model, opt, gen: torch.Generator, what: str, stop: int,
                 cfg, order: EpochOrder | None = None) -> tuple[int, list[dict]]:
    """Load a resumable checkpoint if there is one; return the step to start from (below `stop`,
    the step this run ends at: a finished run is refused, not rerun into an empty report) and the
    history up to it; `order` goes on from the saved epoch and position. A checkpoint written with
    another recipe (`cfg` but for RESUMABLE) is refused, naming the fields: the same weight shapes
    would otherwise train on under mixed settings."""
    if not state_file.is_file():
        return 0, []
    state = load_run_file(state_file, "delete it to train from step 0")
    try:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    except (RuntimeError, ValueError, KeyError) as exc:  # another drafter, or another shape of this one
        first = " ".join(str(exc).split())[:200]
        raise TrtspecError(f"{state_file} is not a checkpoint of this {what} recipe ({first}): resume with "
                           f"the method and options that wrote it, or give a new --out") from None
    saved, recipe = state.get("recipe"), resumable_recipe(cfg)
    if saved is not None:  # checkpoints before the recipe was saved: not checked
        # a field added since the checkpoint was written ran at its default then
        defaults = resumable_recipe(type(cfg).model_construct())
        saved = {**{k: v for k, v in defaults.items() if k not in saved}, **saved}
    if saved is not None and saved != recipe:
        differ = "; ".join(f"{k} was {saved.get(k)}, this run {value}" for k, value in recipe.items()
                           if saved.get(k) != value)
        raise TrtspecError(f"{state_file} was trained with another {what} recipe ({differ}): resume with "
                           f"the options that wrote it, or give a new --out")
    if state["step"] >= stop:
        raise TrtspecError(f"{state_file} has already trained {state['step']} steps and this run stops at "
                           f"{stop}: nothing to train (raise --max-steps or --epochs to go on, or give a "
                           f"new --out)")
    gen.set_state(state["gen"])
    if order is not None:
        resume_order(order, state, state_file, cfg.batch_size)
    log.info("resuming %s training at step %d", what, state["step"])
    history = state.get("history")
    if history is None:  # a checkpoint written before the history went with it
        history = earlier_history(state_file.parent.parent, state["step"])
    return state["step"], history


def resume_order(order: EpochOrder, state: dict, state_file: Path, batch_size: int) -> None:
    """Put `order` where the checkpoint's run stood. A checkpoint from before orders were saved
    drew its batches with replacement: the run goes on without, from the epoch its step count
    reaches."""
    if "order" not in state:
        order.skip_to(state["step"] * batch_size)
        log.warning("%s was written before the example order was saved: its batches were drawn with "
                    "replacement; going on with a fresh order from epoch %d", state_file, order.epoch)
        return
    try:
        order.load_state_dict(state["order"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TrtspecError(f"{state_file}: its example order does not fit this run's data ({exc}): resume "
                           "with the data that wrote it, or give a new --out") from None


def earlier_history(out_dir: Path, start: int) -> list[dict]:
    """The entries up to `start` of the training.json an earlier run wrote in `out_dir` (none
    when that file is gone)."""
    report = out_dir / "training.json"
    if start == 0 or not report.is_file():
        return []
    try:
        history = json.loads(report.read_text(encoding="utf-8")).get("history", [])
        return [h for h in history if h["step"] <= start]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


def save_state(state_file: Path, model, opt, gen: torch.Generator, step: int, cfg,
               history: list[dict] | None = None, order: EpochOrder | None = None) -> None:
    """The resumable checkpoint; `history` (the report's entries so far) goes with it, since a run
    killed between checkpoints writes no training.json, and so does `order` (epoch, position, the
    epoch's permutation), so a resumed run draws the batches the uninterrupted one draws."""
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(), "step": step,
             "recipe": resumable_recipe(cfg), "history": list(history or [])}
    if order is not None:
        state["order"] = order.state_dict()
    with replaced(state_file) as tmp:
        torch.save(state, tmp)


def anchor_range(data: dict, labels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where anchors may go in each regenerated sequence, for blocks of `labels` labels: from its
    last prompt token (lo [N]) to the last token whose next one exists (hi [N]; a block running
    past the end trains on the labels before it), and the sequences that have one (usable).
    Refused unless some response holds a whole block."""
    lo = data["prompt_lens"] - 1  # the last prompt token is the first anchor
    hi = data["lens"] - 2  # the last anchor whose first label exists
    if not (data["lens"] - data["prompt_lens"] >= labels).any():
        raise TrtspecError(f"no regenerated sequence is longer than its prompt + {labels - 1} tokens; "
                           "lower --block-size or raise --response-tokens")
    return lo, hi, (hi >= lo).nonzero().flatten()


def sample_anchors(rows: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, anchors_per_seq: int,
                   gen: torch.Generator) -> torch.Tensor:
    """Sorted anchors drawn uniformly in [lo, hi] of each row of a batch.  rows [b] -> anchors [b, n]"""
    span = (hi[rows] - lo[rows] + 1).float()
    u = torch.rand(len(rows), anchors_per_seq, generator=gen)
    return (lo[rows, None] + (u * span[:, None]).long()).sort(-1).values


def frozen_target(target_dir: Path, seed: int):
    """The target with its weights frozen, torch seeded with the run's seed first."""
    torch.manual_seed(seed)
    target = load_causal_lm(target_dir)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def block_drafter_start(target_dir: Path, prompts_path: Path, out_dir: Path, cfg,
                        mask_token_id: int | None) -> tuple[object, int, dict]:
    """What training a DFlash-style drafter (DFlash, DSpark) starts from: the frozen target, the
    mask id, and the target's own continuations of the prompts (`regenerated_data`); the tap layers
    checked first. cfg: the drafter's train config (seed, target_layer_ids, response_tokens)."""
    target = frozen_target(target_dir, cfg.seed)
    mask_token_id = resolve_mask_token(target, target_dir, mask_token_id)
    check_layer_ids(cfg.target_layer_ids, target.config.num_hidden_layers)
    checkpoint = out_dir / "checkpoint"
    data = regenerated_data(target, target_dir, prompts_path, cfg.response_tokens, checkpoint / "data.pt",
                            trained_on=(checkpoint / "state.pt").is_file())
    return target, mask_token_id, data


def train_dflash(target_dir: Path, prompts_path: Path, out_dir: Path, cfg: DFlashTrainConfig,
                 mask_token_id: int | None = None) -> dict:
    target, mask_token_id, data = block_drafter_start(target_dir, prompts_path, out_dir, cfg, mask_token_id)
    model = new_drafter(target, mask_token_id, cfg)
    taps = target_taps(target, data["seqs"], model.spec.target_layer_ids)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    num = len(data["seqs"])
    lo, hi, usable = anchor_range(data, cfg.block_size - 1)
    total = max(1, int(cfg.epochs * len(usable) / cfg.batch_size))  # an epoch: each usable sequence once
    stop = min(total, cfg.max_steps or total)
    gen = torch.Generator().manual_seed(cfg.seed)
    order = EpochOrder(usable, gen)
    state_file = out_dir / "checkpoint" / "state.pt"
    start, history = resume_state(state_file, model, opt, gen, "DFlash", stop, cfg, order)

    t0 = time.time()
    bar = tqdm(range(start, stop), desc="train dflash", unit="step", initial=start, total=stop)
    for step in bar:
        rows = order.take(cfg.batch_size)  # [b]
        anchors = sample_anchors(rows, lo, hi, cfg.anchors_per_seq, gen)  # [b, n]
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, total, cfg)
        loss, acc = dflash_loss(model, embed, lm_head, data["seqs"][rows], taps[rows], anchors, cfg.decay(),
                                data["lens"][rows])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        # expected accepted drafts per block if slots were independent: sum of prefix products
        tau_est = 1 + acc.cumprod(0).sum().item()
        check_loss(loss.item(), step + 1)
        bar.set_postfix(loss=f"{loss.item():.3f}", tau_est=f"{tau_est:.2f}")
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == stop:
            history.append({"step": step + 1, "loss": round(loss.item(), 4), "tau_est": round(tau_est, 3),
                            "seconds": round(time.time() - t0, 1)})
            save_dflash(model, out_dir)  # before the state, which must not run ahead of it
            save_state(state_file, model, opt, gen, step + 1, cfg, history, order)
    report = {"recipe": cfg.model_dump(), "target": str(target_dir), "prompts": str(prompts_path),
              "sequences": num, "history": history}
    write_text(out_dir / "training.json", json.dumps(report, indent=1))
    return report
