"""`trtspec train ...` and `trtspec calibrate`: the embedded models, the drafters, DSpark's STS."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.cli.common import (
    CHECKPOINT_DIR,
    EXISTING_DIR,
    EXISTING_FILE,
    int_list,
    main,
    tasks_arg,
)
from trtspec.cli_errors import (
    PathArg,
    check_range,
    load_prompts_arg,
    options_model,
    run_errors,
    writable_arg,
)


@main.group()
def train() -> None:
    """Train the embedded models and drafters."""


def _training_out(out_dir: Path, target_dir: Path) -> None:
    """Refuse a `train --out` folder that is the target's, or holds files but is no training run's
    output: the run writes config.json and model.safetensors there, over a checkpoint's own
    (`--out` = `--target` overwrote the target)."""
    writable_arg(out_dir, "--out", folder=True)  # before the regeneration and training, not after
    if out_dir.resolve() == target_dir.resolve():
        raise click.BadParameter(f"{out_dir} is the --target folder, whose config.json and weights "
                                 "training would overwrite; give a new folder", param_hint="--out")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "checkpoint").is_dir():
        raise click.BadParameter(f"{out_dir} holds files but no earlier training run (no checkpoint/ in "
                                 "it), and training writes config.json and model.safetensors into it; give "
                                 "a new or empty folder", param_hint="--out")


@train.command("target")
@click.option("--out", type=PathArg(file_okay=False, path_type=Path), required=True,
              help="Folder to write tiny-target/ and tiny-draft/ into, each replaced whole once both are "
                   "trained (the shipped ones are in trtspec/assets/; scripts/train_embedded.sh copies them "
                   "there).")
@click.option("--steps", default=2400, show_default=True, type=int, help="Optimizer steps (>= 1).")
@click.option("--seed", default=0, show_default=True, type=int, help="Recipe seed.")
@click.option("--lr", default=3e-3, show_default=True, type=float, help="Peak learning rate (> 0).")
@click.option("--overshoot-share", default=0.0, show_default=True, type=float,
              help="Share of indented lines over-extended in the input, in [0, 1] (train/overshoot.py).")
@click.option("--overshoot-stop-every", is_flag=True,
              help="Label every overshot position with the line's real first byte, not only the last.")
@click.option("--init-from", type=EXISTING_DIR, default=None,
              help="Continue from tiny-target/ and tiny-draft/ in this folder (a later recipe stage).")
@run_errors
def train_target(out: Path, steps: int, seed: int, lr: float, overshoot_share: float,
                 overshoot_stop_every: bool, init_from: Path | None) -> None:
    """Pre-train the embedded byte-level target and its draft model (the shipped recipe).

    The shipped models are two stages: `trtspec train target --out STAGE1`, then
    `trtspec train target --init-from STAGE1 --steps 600 --lr 1e-3 --overshoot-share 0.2
    --overshoot-stop-every --seed 1`.
    """
    from trtspec.train.pretrain import PretrainConfig, pretrain

    writable_arg(out, "--out", folder=True)  # before hours of training, not after
    for name in ("tiny-target", "tiny-draft") if init_from else ():
        if not (init_from / name / "model.safetensors").is_file():
            raise click.BadParameter(f"{init_from / name}: no model.safetensors to continue training from "
                                     "(give the --out folder of an earlier `train target`)",
                                     param_hint="--init-from")
    cfg = options_model(PretrainConfig, steps=steps, seed=seed, lr=lr, overshoot_share=overshoot_share,
                        overshoot_stop_every=overshoot_stop_every, init_from=init_from)
    report = pretrain(out, cfg)
    click.echo(json.dumps(report["history"][-1]))


@train.command("dflash")
@click.option("--target", "target_dir", required=True, type=CHECKPOINT_DIR,
              help="Target checkpoint directory.")
@click.option("--prompts", "prompts_path", required=True, type=EXISTING_FILE,
              help="JSONL with a `prompt` or chat `messages` per line (or text, one per line) to answer.")
@click.option("--block-size", default=16, show_default=True, type=int,
              help="DFlash block size B, in [2, 256]: the anchor and B - 1 drafts.")
@click.option("--out", "out_dir", required=True, type=PathArg(file_okay=False, path_type=Path),
              help="Output folder (z-lab layout): new, empty, or an earlier run's "
                   "(its `checkpoint/` resumes it); each checkpoint replaces the last whole.")
@click.option("--layers", default=2, show_default=True, type=int, help="Drafter decoder layers (>= 1).")
@click.option("--target-layer-ids", default=None, help="Comma-separated taps; default z-lab's spread.")
@click.option("--epochs", default=6.0, show_default=True, type=float,
              help="Passes over the data (> 0, at most 1000).")
@click.option("--lr", default=6e-4, show_default=True, type=float, help="Peak learning rate (> 0).")
@click.option("--response-tokens", default=192, show_default=True, type=int,
              help="Tokens the target regenerates per prompt (>= 8).")
@click.option("--max-steps", default=None, type=int, help="Stop after this many steps (>= 1; a short run).")
@click.option("--mask-token-id", default=None, type=int, help="Mask id if the target config has none.")
@run_errors
def train_dflash_cmd(target_dir, prompts_path, block_size, out_dir, layers, target_layer_ids, epochs, lr,
                     response_tokens, max_steps, mask_token_id) -> None:
    """Distil a DFlash drafter from a target's own regenerated responses."""
    from trtspec.train.dflash import DFlashTrainConfig, train_dflash

    _training_out(out_dir, target_dir)
    load_prompts_arg(prompts_path)
    ids = int_list(target_layer_ids, "--target-layer-ids", low=0) if target_layer_ids else None
    cfg = options_model(DFlashTrainConfig, {"num_layers": "--layers"}, block_size=block_size,
                        num_layers=layers, target_layer_ids=ids, epochs=epochs, lr=lr,
                        response_tokens=response_tokens, max_steps=max_steps)
    report = train_dflash(target_dir, prompts_path, out_dir, cfg, mask_token_id)
    click.echo(json.dumps(report["history"][-1]))


@train.command("eagle3")
@click.option("--target", "target_dir", required=True, type=CHECKPOINT_DIR,
              help="Target checkpoint directory.")
@click.option("--prompts", "prompts_path", required=True, type=EXISTING_FILE,
              help="JSONL with a `prompt` or chat `messages` per line (or text, one per line) to answer.")
@click.option("--out", "out_dir", required=True, type=PathArg(file_okay=False, path_type=Path),
              help="Output folder (SafeAILab/SpecForge layout): new, empty, or an earlier run's "
                   "(its `checkpoint/` resumes it); each checkpoint replaces the last whole.")
@click.option("--ttt-steps", default=7, show_default=True, type=int,
              help="Training-time-test steps, in [1, 64].")
@click.option("--draft-vocab-size", default=None, type=int,
              help="Reduced draft vocabulary (d2t/t2d), >= 1; default the target's.")
@click.option("--aux-layer-ids", default=None, help="Comma-separated low,mid,high taps; default EAGLE-3's.")
@click.option("--epochs", default=2.0, show_default=True, type=float,
              help="Passes over the data (> 0, at most 1000).")
@click.option("--lr", default=1e-3, show_default=True, type=float, help="Peak learning rate (> 0).")
@click.option("--response-tokens", default=192, show_default=True, type=int,
              help="Tokens the target regenerates per prompt (>= 8).")
@click.option("--max-steps", default=None, type=int, help="Stop after this many steps (>= 1; a short run).")
@run_errors
def train_eagle3_cmd(target_dir, prompts_path, out_dir, ttt_steps, draft_vocab_size, aux_layer_ids, epochs,
                     lr, response_tokens, max_steps) -> None:
    """Train an EAGLE-3 drafter with training-time test on a target's own regenerated responses."""
    from trtspec.train.eagle3 import Eagle3TrainConfig, train_eagle3

    _training_out(out_dir, target_dir)
    load_prompts_arg(prompts_path)
    ids = int_list(aux_layer_ids, "--aux-layer-ids", low=0) if aux_layer_ids else None
    cfg = options_model(Eagle3TrainConfig, ttt_steps=ttt_steps, draft_vocab_size=draft_vocab_size,
                        aux_layer_ids=ids, epochs=epochs, lr=lr, response_tokens=response_tokens,
                        max_steps=max_steps)
    report = train_eagle3(target_dir, prompts_path, out_dir, cfg)
    click.echo(json.dumps(report["history"][-1]))


@train.command("dspark")
@click.option("--target", "target_dir", required=True, type=CHECKPOINT_DIR,
              help="Target checkpoint directory.")
@click.option("--prompts", "prompts_path", required=True, type=EXISTING_FILE,
              help="JSONL with a `prompt` or chat `messages` per line (or text, one per line) to answer.")
@click.option("--out", "out_dir", required=True, type=PathArg(file_okay=False, path_type=Path),
              help="Output folder (DeepSpec layout): new, empty, or an earlier run's "
                   "(its `checkpoint/` resumes it); each checkpoint replaces the last whole.")
@click.option("--block-size", default=15, show_default=True, type=int,
              help="γ: drafts per block, in [1, 256].")
@click.option("--layers", default=2, show_default=True, type=int, help="Drafter decoder layers (>= 1).")
@click.option("--target-layer-ids", default=None, help="Comma-separated taps; default z-lab's spread.")
@click.option("--markov-rank", default=256, show_default=True, type=int,
              help="Markov head rank r, in [0, 8192]; 0 = none.")
@click.option("--markov-head-type", default="vanilla", show_default=True,
              type=click.Choice(["vanilla", "gated", "rnn"]),
              help="DeepSpec Markov head: vanilla, gated (by the backbone state) or rnn "
                   "(a state over the block).")
@click.option("--epochs", default=4.0, show_default=True, type=float,
              help="Passes over the data (> 0, at most 1000).")
@click.option("--max-steps", default=None, type=int, help="Stop after this many steps (>= 1; a short run).")
@click.option("--lr", default=1e-3, show_default=True, type=float, help="Peak learning rate (> 0).")
@click.option("--response-tokens", default=192, show_default=True, type=int,
              help="Tokens the target regenerates per prompt (>= 8).")
@click.option("--mask-token-id", default=None, type=int, help="Mask id if the target config has none.")
@run_errors
def train_dspark_cmd(target_dir, prompts_path, out_dir, block_size, layers, target_layer_ids, markov_rank,
                     markov_head_type, epochs, max_steps, lr, response_tokens, mask_token_id) -> None:
    """Distil a DSpark drafter (Markov + confidence heads) from a target's regenerated responses."""
    from trtspec.train.dspark import DSparkTrainConfig, train_dspark

    _training_out(out_dir, target_dir)
    load_prompts_arg(prompts_path)
    ids = int_list(target_layer_ids, "--target-layer-ids", low=0) if target_layer_ids else None
    cfg = options_model(DSparkTrainConfig, {"num_layers": "--layers"}, block_size=block_size,
                        num_layers=layers, target_layer_ids=ids, markov_rank=markov_rank,
                        markov_head_type=markov_head_type, epochs=epochs,
                        max_steps=max_steps, lr=lr, response_tokens=response_tokens)
    report = train_dspark(target_dir, prompts_path, out_dir, cfg, mask_token_id)
    click.echo(json.dumps(report["history"][-1]))


@main.command()
@click.option("--drafter", "drafter_dir", required=True, type=EXISTING_DIR,
              help="DSpark checkpoint directory; the temperatures are written to its sts.json.")
@click.option("--target", "target_dir", required=True, type=CHECKPOINT_DIR,
              help="Target checkpoint directory the drafter serves.")
@click.option("--tasks", default="code,math,chat", show_default=True, help="Held-out prompt sets.")
@click.option("--response-tokens", default=256, show_default=True, type=int,
              help="Tokens the target continues each prompt by (>= 1).")
@click.option("--bins", default=10, show_default=True, type=int, help="ECE bins, in [2, 1000].")
@run_errors
def calibrate(drafter_dir, target_dir, tasks, response_tokens, bins) -> None:
    """Fit Sequential Temperature Scaling of a DSpark drafter's confidences on held-out prompts
    (greedy verification) and store the temperatures with the drafter."""
    from trtspec.spec.sts import STS_FILE
    from trtspec.train.calibrate import calibrate as run_calibrate
    from trtspec.train.calibrate import pooled_ece

    check_range(response_tokens, "--response-tokens", low=1)
    check_range(bins, "--bins", low=2, high=1000)
    # before the regeneration and the fit, not after (an sts.json folder failed then, naming a temporary file)
    if (drafter_dir / STS_FILE).is_dir():
        raise click.BadParameter(f"{drafter_dir / STS_FILE} is a folder, where calibrate writes the "
                                 "temperatures; remove it", param_hint="--drafter")
    writable_arg(drafter_dir, "--drafter", folder=True)
    cal = run_calibrate(drafter_dir, target_dir, tasks_arg(tasks), response_tokens, bins)
    before, after = pooled_ece(cal)
    click.echo(f"STS temperatures: {cal.temperatures}")
    click.echo(f"held-out ECE of survival per slot before: {cal.ece_before}")
    click.echo(f"held-out ECE of survival per slot after:  {cal.ece_after}")
    click.echo(f"mean ECE before {before:.4f} after {after:.4f} ({cal.source}); "
               f"written to {drafter_dir / 'sts.json'}")
