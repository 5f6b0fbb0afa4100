"""`trtspec` command line: thin commands over the library; user errors are one line, exit 2."""

from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path

import click

from trtspec.errors import TrtspecError


def user_errors(fn):
    """Turn library errors about user input into one-line click errors (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (TrtspecError, ValueError, OSError) as exc:
            raise click.UsageError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from None

    return wrapper


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log progress at INFO level.")
def main(verbose: bool) -> None:
    """trtspec: speculative decoding (DFlash, DSpark, EAGLE-3, draft models) for TensorRT and
    Triton Inference Server."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(path_type=Path),
              help="Build config YAML, e.g. build_configs/tiny-draft-model.yaml.")
@click.option("--prompt", required=True, help="Text to continue.")
@click.option("--max-tokens", default=128, show_default=True, type=int,
              help="Most tokens to generate.")
@click.option("--temperature", default=0.0, show_default=True, type=float,
              help="0 = greedy; > 0 samples.")
@click.option("--top-p", default=1.0, show_default=True, type=float, help="Nucleus mass, (0, 1].")
@click.option("--top-k", default=0, show_default=True, type=int, help="Keep k most likely; 0 = all.")
@click.option("--seed", default=None, type=int, help="Seed for sampling.")
@click.option("--drafter", "drafter_choice", type=click.Choice(["config", "none"]), default="config",
              show_default=True, help="`none` decodes autoregressively through the same target.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@user_errors
def generate(config_path, prompt, max_tokens, temperature, top_p, top_k, seed, drafter_choice,
             as_json) -> None:
    """Generate text speculatively with the configured target and drafter."""
    from pydantic import ValidationError

    from trtspec.config import load_build_config
    from trtspec.pipeline import load_pipeline
    from trtspec.spec.sampling import SamplingParams

    if not prompt:
        raise click.BadParameter("must not be empty", param_hint="--prompt")
    if max_tokens < 1:
        raise click.BadParameter(f"must be >= 1, got {max_tokens}", param_hint="--max-tokens")
    try:
        sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    except ValidationError as exc:
        err = exc.errors()[0]
        hint = f"--{str(err['loc'][0]).replace('_', '-')}"
        raise click.BadParameter(err["msg"], param_hint=hint) from None
    config = load_build_config(config_path)
    pipeline = load_pipeline(config, use_drafter=drafter_choice != "none")
    text, result = pipeline.generate(prompt, max_tokens, sampling)
    if as_json:
        click.echo(json.dumps({"text": text, "drafter": pipeline.drafter.method, **result.to_dict()}))
    else:
        click.echo(text)
        click.echo(
            f"[{pipeline.drafter.method}] tau={result.tau:.2f} "
            f"target_calls={result.num_target_calls} "
            f"decode={result.decode_tokens_per_s:.1f} tok/s",
            err=True,
        )


@main.group()
def train() -> None:
    """Train the embedded models and drafters."""


@train.command("target")
@click.option("--out", type=click.Path(path_type=Path), default=Path("trtspec/assets"),
              show_default=True, help="Folder to write tiny-target/ and tiny-draft/ into.")
@click.option("--steps", default=1500, show_default=True, type=int, help="Optimizer steps.")
@click.option("--seed", default=0, show_default=True, type=int, help="Recipe seed.")
@user_errors
def train_target(out: Path, steps: int, seed: int) -> None:
    """Pre-train the embedded byte-level target and its draft model (the shipped recipe)."""
    from trtspec.train.pretrain import PretrainConfig, pretrain

    report = pretrain(out, PretrainConfig(steps=steps, seed=seed))
    click.echo(json.dumps(report["history"][-1]))


@train.command("dflash")
@click.option("--target", "target_dir", required=True, type=click.Path(path_type=Path),
              help="Target checkpoint directory.")
@click.option("--prompts", "prompts_path", required=True, type=click.Path(path_type=Path),
              help="JSONL with a `prompt` per line (or text, one per line) for the target to continue.")
@click.option("--block-size", default=16, show_default=True, type=int, help="DFlash block size B.")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Output folder (z-lab layout; `checkpoint/` inside makes it resumable).")
@click.option("--layers", default=2, show_default=True, type=int, help="Drafter decoder layers.")
@click.option("--target-layer-ids", default=None, help="Comma-separated taps; default z-lab's spread.")
@click.option("--epochs", default=6.0, show_default=True, type=float, help="Passes over the data.")
@click.option("--lr", default=6e-4, show_default=True, type=float, help="Peak learning rate.")
@click.option("--response-tokens", default=192, show_default=True, type=int,
              help="Tokens the target regenerates per prompt.")
@click.option("--mask-token-id", default=None, type=int, help="Mask id if the target config has none.")
@user_errors
def train_dflash_cmd(target_dir, prompts_path, block_size, out_dir, layers, target_layer_ids, epochs, lr,
                     response_tokens, mask_token_id) -> None:
    """Distil a DFlash drafter from a target's own regenerated responses."""
    from trtspec.train.dflash import DFlashTrainConfig, train_dflash

    ids = [int(x) for x in target_layer_ids.split(",")] if target_layer_ids else None
    cfg = DFlashTrainConfig(block_size=block_size, num_layers=layers, target_layer_ids=ids, epochs=epochs,
                            lr=lr, response_tokens=response_tokens)
    report = train_dflash(target_dir, prompts_path, out_dir, cfg, mask_token_id)
    click.echo(json.dumps(report["history"][-1]))


@main.command()
@click.argument("configs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--tasks", default="code,math,chat", show_default=True, help="Comma-separated prompt sets.")
@click.option("--prompts", "prompts_per_task", default=8, show_default=True, type=int,
              help="Prompts per task.")
@click.option("--max-tokens", default=256, show_default=True, type=int, help="Tokens per prompt.")
@click.option("--repeats", default=1, show_default=True, type=int, help="Interleaved repetitions.")
@click.option("--no-hf", is_flag=True, help="Skip the transformers reference columns.")
@click.option("--out", "out_dir", default=Path("bench-out"), show_default=True,
              type=click.Path(path_type=Path), help="Where results.json, results.md and plots go.")
@click.option("--doc", "doc_path", default=None, type=click.Path(path_type=Path),
              help="Also write this Markdown report (e.g. docs/BENCHMARKS.md).")
@user_errors
def bench(configs, tasks, prompts_per_task, max_tokens, repeats, no_hf, out_dir, doc_path) -> None:
    """Benchmark the drafters of CONFIGS (same target) against the target alone, side by side."""
    from trtspec.bench.run import markdown_table, run_bench
    from trtspec.config import load_build_config

    loaded = {}
    for path in configs:
        cfg = load_build_config(path)
        if cfg.drafter is None:
            raise click.BadParameter(f"{path} has no drafter", param_hint="CONFIGS")
        loaded[cfg.drafter.method] = cfg
    results = run_bench(loaded, tasks.split(","), prompts_per_task, max_tokens, repeats, not no_hf)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    table = markdown_table(results)
    (out_dir / "results.md").write_text(table + "\n")
    from trtspec.bench.report import write_report

    command = "trtspec " + " ".join(sys.argv[1:])
    write_report(results, out_dir, command, doc_path or out_dir / "BENCHMARKS.md")
    click.echo(table)


@main.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
@user_errors
def inspect(config_path, as_json) -> None:
    """Plan CONFIG's memory per GPU: weights after TP/PP/EP, drafter, KV cache, what fits."""
    from trtspec.config import load_build_config
    from trtspec.plan.memory import format_plan
    from trtspec.trtllm.build import plan_config

    config = load_build_config(config_path)
    plan = plan_config(config)
    click.echo(json.dumps(plan.to_dict()) if as_json else format_plan(plan, config.deployment))


@main.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Folder for the generated artifacts.")
@user_errors
def build(config_path, out_dir) -> None:
    """Build CONFIG's deployment artifacts (flavour trtllm: TensorRT-LLM configs, Triton repo, launchers)."""
    from trtspec.config import load_build_config
    from trtspec.trtllm.build import build_trtllm

    config = load_build_config(config_path)
    if config.flavour != "trtllm":
        raise click.UsageError(f"{config_path}: `build` for flavour {config.flavour!r} lands with the "
                               "Triton/engine issues; only flavour trtllm builds here")
    for path in build_trtllm(config, out_dir):
        click.echo(str(path))


if __name__ == "__main__":
    main()
