"""The recipe that trains the embedded byte-level Qwen3 target and its small draft model.

Both models learn next-byte prediction on `corpus.training_corpus("train")` side by side (one
batch, two optimizers), so one run produces `tiny-target/` and `tiny-draft/`. The shipped models
come from two runs: stage 1 from fresh weights on the text as it is, stage 2 (`init_from`) from
stage 1 with the overshoot correction of `overshoot.py`; each stage's training.json keeps the
previous one's. Seeds fix the weights' initialisation and the batch order; the corpus is this
interpreter's stdlib, whose version and SHA-256 are written to `training.json` beside the weights.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import platform
import random
import time
from contextlib import ExitStack
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors import SafetensorError
from tqdm import tqdm
from transformers import Qwen3Config, Qwen3ForCausalLM

from trtspec.errors import CheckpointError, TrtspecError
from trtspec.files import replaced_dir, share
from trtspec.models.target import load_causal_lm
from trtspec.tokenizer import DEFAULT_VOCAB_SIZE, ByteTokenizer
from trtspec.train import check_loss
from trtspec.train.corpus import CHAT_STOP, CHAT_TEMPLATE, CHAT_TEMPLATE_FILE, training_corpus
from trtspec.train.overshoot import IGNORE, overshoot_window

log = logging.getLogger(__name__)


class ByteModelShape(BaseModel):
    """Architecture of one byte-level Qwen3 model."""

    hidden_size: int = Field(description="model width")
    num_hidden_layers: int = Field(description="decoder layers")
    num_attention_heads: int = Field(description="query heads")
    num_key_value_heads: int = Field(description="key/value heads (GQA when fewer than queries)")
    head_dim: int = Field(64, description="width of one attention head")
    intermediate_size: int = Field(description="MLP width")


TARGET_SHAPE = ByteModelShape(
    hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=640,
)
DRAFT_SHAPE = ByteModelShape(
    hidden_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    intermediate_size=384,
)


class PretrainConfig(BaseModel):
    """Hyper-parameters of the embedded-model recipe."""

    model_config = ConfigDict(allow_inf_nan=False)  # --epochs inf was an OverflowError traceback

    steps: int = Field(2400, ge=1, description="optimizer steps")
    batch_size: int = Field(24, ge=1, description="sequences per step")
    seq_len: int = Field(256, ge=8, description="bytes per training sequence")
    lr: float = Field(3e-3, gt=0, description="peak AdamW learning rate")
    warmup: float = Field(0.03, ge=0, le=1, description="fraction of steps of linear warm-up")
    weight_decay: float = Field(0.05, ge=0, description="AdamW weight decay")
    arithmetic_fraction: float = Field(0.3, gt=0, lt=1, description="share of arithmetic bytes in the corpus")
    seed: int = Field(0, description="seed of initialisation and batch order")
    eval_every: int = Field(250, ge=1, description="steps between held-out evaluations")
    threads: int = Field(2, ge=1, description="torch CPU threads")
    overshoot_share: float = Field(
        0.0, ge=0, le=1,
        description="share of indented lines whose indentation is over-extended in the input "
        "(the overshoot correction, train/overshoot.py); 0 trains on the text as it is",
    )
    overshoot_max: int = Field(128, ge=1, description="largest number of extra spaces inserted")
    overshoot_stop_every: bool = Field(
        False, description="label every overshot position with the line's real first byte, not "
        "only the last inserted space",
    )
    init_from: Path | None = Field(
        None, description="folder holding tiny-target/ and tiny-draft/ to continue training from "
        "(a later stage of the recipe); None initialises fresh weights",
    )


def byte_model_config(shape: ByteModelShape, tokenizer: ByteTokenizer) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=DEFAULT_VOCAB_SIZE,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        architectures=["Qwen3ForCausalLM"],
        **shape.model_dump(),
        **tokenizer.config_entries(),
    )


def _lr_at(step: int, cfg: PretrainConfig) -> float:
    warm = max(1, int(cfg.warmup * cfg.steps))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _batch(
    data: torch.Tensor, cfg: PretrainConfig, gen: torch.Generator, rng: random.Random
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and labels, both [b, t], with the overshoot correction where it is asked for."""
    starts = torch.randint(0, len(data) - cfg.seq_len - 1, (cfg.batch_size,), generator=gen)
    windows = torch.stack([data[s : s + cfg.seq_len + 1] for s in starts.tolist()])  # [b, t+1]
    inputs, labels = windows[:, :-1].clone(), windows[:, 1:].clone()
    for i in range(cfg.batch_size):
        if cfg.overshoot_share:
            pair = overshoot_window(windows[i].tolist(), cfg.seq_len, cfg.overshoot_max, rng,
                                    cfg.overshoot_share, cfg.overshoot_stop_every)
            if pair is not None:
                inputs[i], labels[i] = torch.tensor(pair[0]), torch.tensor(pair[1])
    return inputs, labels


def heldout_windows(data: torch.Tensor, seq_len: int, n: int) -> torch.Tensor:
    """`n` fixed windows of `seq_len + 1` elements, evenly spaced over `data`: [n, t+1]."""
    stride = max(1, (len(data) - seq_len - 1) // n)
    return torch.stack([data[i * stride : i * stride + seq_len + 1] for i in range(n)])


@torch.no_grad()
def heldout_loss(model: Qwen3ForCausalLM, data: torch.Tensor, seq_len: int, n: int = 32) -> float:
    """Mean next-byte cross-entropy (nats) over `n` fixed windows of the held-out text."""
    model.eval()
    windows = heldout_windows(data, seq_len, n)
    logits = model(windows[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
    model.train()
    return loss.item()


def _load_stage(path: Path) -> Qwen3ForCausalLM:
    if not (path / "model.safetensors").is_file():
        raise CheckpointError(f"{path}: no model.safetensors to continue training from (--init-from)")
    # trtspec's loader: transformers' own built a default 8B Qwen3 for a folder without config.json (killed
    # for memory) and let a torn model.safetensors through as a SafetensorError traceback
    return load_causal_lm(path)


def _stage_report(path: Path) -> dict | None:
    """The training.json of the stage a model continues from (None if it has none)."""
    report = path / "training.json"
    if not report.is_file():
        return None
    try:
        return json.loads(report.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # was the bare "Expecting value: line 1 ..."
        raise CheckpointError(f"{report} is not valid JSON ({exc}); delete it to continue from the weights "
                              "without the earlier stage's record") from None


def pretrain(out_dir: Path, cfg: PretrainConfig) -> dict:
    """Train target and draft model, save them to `out_dir/tiny-target` and `tiny-draft`: each
    folder is written beside its place and swapped in once both are complete (`replaced_dir`), so
    a failed or interrupted save leaves the earlier stage's folders, or none, never half of one."""
    check_out_dir(out_dir)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    tokenizer = ByteTokenizer()
    train_bytes = training_corpus("train", cfg.arithmetic_fraction, seed=cfg.seed)
    heldout_bytes = training_corpus("heldout", cfg.arithmetic_fraction, seed=cfg.seed + 1)
    train = torch.frombuffer(bytearray(train_bytes), dtype=torch.uint8).long()
    heldout = torch.frombuffer(bytearray(heldout_bytes), dtype=torch.uint8).long()

    shapes = {"tiny-target": TARGET_SHAPE, "tiny-draft": DRAFT_SHAPE}
    if cfg.init_from is None:
        models = {name: Qwen3ForCausalLM(byte_model_config(shape, tokenizer))
                  for name, shape in shapes.items()}
        previous = dict.fromkeys(shapes)
    else:
        models = {name: _load_stage(cfg.init_from / name) for name in shapes}
        previous = {name: _stage_report(cfg.init_from / name) for name in shapes}
    opts = {
        name: torch.optim.AdamW(m.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                betas=(0.9, 0.95))
        for name, m in models.items()
    }
    gen = torch.Generator().manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    history: list[dict] = []
    start = time.time()
    bar = tqdm(range(cfg.steps), desc="pretrain", unit="step")
    for step in bar:
        inputs, labels = _batch(train, cfg, gen, rng)  # [b, t] each
        losses = {}
        for name, model in models.items():
            for group in opts[name].param_groups:
                group["lr"] = _lr_at(step, cfg)
            logits = model(inputs).logits  # [b, t, V]
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                                     ignore_index=IGNORE)
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opts[name].step()
            losses[name] = loss.item()
            check_loss(losses[name], step + 1)
        bar.set_postfix(target=f"{losses['tiny-target']:.3f}", draft=f"{losses['tiny-draft']:.3f}")
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            row = {"step": step + 1, "seconds": round(time.time() - start, 1)}
            for name, model in models.items():
                row[f"{name}/train_loss"] = round(losses[name], 4)
                row[f"{name}/heldout_loss"] = round(heldout_loss(model, heldout, cfg.seq_len), 4)
                check_loss(row[f"{name}/heldout_loss"], step + 1)  # the step's update is in it
            history.append(row)
            log.info("%s", row)
            bar.write(json.dumps(row))

    report = {
        "recipe": cfg.model_dump(mode="json"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "corpus_sha256": hashlib.sha256(train_bytes).hexdigest(),
        "corpus_bytes": {"train": len(train_bytes), "heldout": len(heldout_bytes)},
        "history": history,
    }
    with ExitStack() as folders:  # both models whole, or the earlier ones left as they were
        staged = {name: folders.enter_context(replaced_dir(out_dir / name)) for name in models}
        for name, model in models.items():
            n_params = sum(p.numel() for p in model.parameters())
            stage = {**report, "parameters": n_params, "previous_stage": previous[name]}
            try:
                _save_model(model, staged[name], stage)
            except (OSError, SafetensorError) as exc:
                raise TrtspecError(f"{out_dir / name}: cannot write it ({' '.join(str(exc).split())}); "
                                   f"{out_dir} keeps what it held before this run") from None
    return report


def _save_model(model: Qwen3ForCausalLM, path: Path, stage: dict) -> None:
    """Weights, config, chat template and the stage's training.json, into the folder `path`."""
    model.config.trtspec_chat_stop = list(CHAT_STOP)
    model.save_pretrained(path, safe_serialization=True)
    (path / CHAT_TEMPLATE_FILE).write_text(CHAT_TEMPLATE, encoding="utf-8")
    (path / "training.json").write_text(json.dumps(stage, indent=1), encoding="utf-8")
    for file in path.iterdir():  # transformers 5 writes model.safetensors 0600 (its own temporary file)
        share(file, 0o666)


def check_out_dir(out_dir: Path) -> None:
    """Refuse an `--out` the models cannot be written into, before hours of training."""
    for path in (out_dir, out_dir / "tiny-target", out_dir / "tiny-draft"):
        if path.exists() and not path.is_dir():
            raise TrtspecError(f"{path} is a file; `train target --out` needs a folder to write "
                               "tiny-target/ and tiny-draft/ into")
