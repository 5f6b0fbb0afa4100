"""`trtspec` command line: thin commands over the library.

A bad option or argument is a usage error (exit 2, with usage); a failure while running is one
`Error:` line (exit 1). See `trtspec.cli_errors` for which is which.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click

from trtspec.cli_errors import (
    PathArg,
    check_range,
    load_config_arg,
    load_prompts_arg,
    options_model,
    run_errors,
    utf8_text,
    writable_arg,
)
from trtspec.errors import TrtspecError

EXISTING_DIR = PathArg(exists=True, file_okay=False, path_type=Path)


class CheckpointDir(click.ParamType):
    """A checkpoint folder: an existing directory, or `builtin:NAME` (a shipped model in
    trtspec/assets/NAME), as a build config's `path` takes it."""

    name = "directory"

    def get_metavar(self, param, ctx=None) -> str:
        return "DIRECTORY|builtin:NAME"

    def convert(self, value, param, ctx) -> Path:
        from trtspec.config import ASSETS_DIR, BUILTIN_PREFIX

        def shipped() -> list[str]:
            return sorted(p.name for p in ASSETS_DIR.iterdir() if (p / "config.json").is_file())

        if isinstance(value, str) and value.startswith(BUILTIN_PREFIX):
            name = value[len(BUILTIN_PREFIX) :]
            if name not in (names := shipped()):
                self.fail(f"{value!r} names no shipped model (builtin: takes one of {', '.join(names)})",
                          param, ctx)
            return ASSETS_DIR / name
        try:
            return EXISTING_DIR.convert(value, param, ctx)
        except click.BadParameter as exc:  # the folders listed only where they are the answer
            self.fail(f"{exc.message.rstrip('.')}; or builtin:NAME, a shipped model ({', '.join(shipped())})",
                      param, ctx)


CHECKPOINT_DIR = CheckpointDir()
EXISTING_FILE = PathArg(exists=True, dir_okay=False, path_type=Path)
PORT = click.IntRange(1, 65535)


def _url_arg(url: str, hint: str = "--url") -> str:
    from trtspec.triton.client import ClientError, split_url

    try:
        split_url(url)
    except ClientError as exc:
        expected = str(exc).split(": ", 1)[-1]  # the client names the option itself; click does here
        raise click.BadParameter(f"{expected}, got {url!r}", param_hint=hint) from None
    return url


def _served_names(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    """--served-model-name's values: names, each once."""
    for k, name in enumerate(values):
        if not name.strip() or name != name.strip():
            raise click.BadParameter(f"{name!r}: a name with no spaces around it",
                                     param_hint="--served-model-name")
        if name in values[:k]:
            raise click.BadParameter(f"{name!r} is given twice", param_hint="--served-model-name")
    return values


def _origins(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    """--allowed-origin's values, each an origin as a browser sends it (openai/cors.py)."""
    from trtspec.openai.cors import check_origin

    try:
        return tuple(check_origin(value) for value in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--allowed-origin") from None


def _tasks_arg(tasks: str, hint: str = "--tasks") -> list[str]:
    from trtspec.prompts import TASKS

    names = [t for t in tasks.split(",") if t]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise click.BadParameter(f"unknown task(s) {unknown or [tasks]}; expected a comma-separated subset "
                                 f"of {', '.join(TASKS)}", param_hint=hint)
    _each_once(names, tasks, hint)
    return names


def _each_once(values: list, text: str, hint: str) -> None:
    """Refuse a comma-separated option that repeats a value (a repeated task, concurrency, batch or
    layer tap is a typo: it measured or tapped the same thing twice)."""
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise click.BadParameter(f"{', '.join(map(str, repeated))} given twice in {text!r}; each value once",
                                 param_hint=hint)


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log progress at INFO level.")
def main(verbose: bool) -> None:
    """trtspec: speculative decoding (DFlash, DSpark, EAGLE-3, draft models) for TensorRT and
    Triton Inference Server."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)


@main.command()
@click.option("--config", "config_path", default=None, type=PathArg(path_type=Path),
              help="Build config YAML, e.g. build_configs/tiny-draft-model.yaml (runs in this process).")
@click.option("--url", default=None,
              help="Ask a served model instead: grpc://HOST:PORT (stream API) or http://HOST:PORT (Triton), "
                   "openai://HOST:PORT (any OpenAI-compatible server: trtspec, trtllm-serve, vLLM, SGLang).")
@click.option("--model", "model_name", default="trtspec", show_default=True,
              help="Served model name (with --url).")
@click.option("--stream", is_flag=True, help="With --url: print text as the server streams it.")
@click.option("--chat", is_flag=True, help="Send the prompt as one user message: through the target's "
              "chat template (--config), or to /v1/chat/completions (openai://).")
@click.option("--api-key", envvar="OPENAI_API_KEY", default=None,
              help="With openai://: bearer token (env OPENAI_API_KEY).")
@click.option("--wait", "wait_s", default=0.0, show_default=True, type=float,
              help="With --url: seconds to wait for the server to become ready.")
@click.option("--prompt", required=True, help="Text to continue.")
@click.option("--max-tokens", default=128, show_default=True, type=int,
              help="Most tokens to generate.")
@click.option("--temperature", default=0.0, show_default=True, type=float,
              help="0 = greedy; > 0 samples.")
@click.option("--top-p", default=1.0, show_default=True, type=float, help="Nucleus mass, (0, 1].")
@click.option("--top-k", default=0, show_default=True, type=int, help="Keep k most likely; 0 = all.")
@click.option("--min-p", default=0.0, show_default=True, type=float,
              help="In [0, 1]: drop tokens less likely than min-p times the most likely one; 0 = off.")
@click.option("--seed", default=None, type=click.IntRange(0, 2**64 - 1), help="Seed for sampling.")
@click.option("--presence-penalty", default=0.0, show_default=True, type=float,
              help="In [-2, 2]: subtracted from the logit of every token generated so far.")
@click.option("--frequency-penalty", default=0.0, show_default=True, type=float,
              help="In [-2, 2]: times each token's count so far, subtracted from its logit.")
@click.option("--repetition-penalty", default=1.0, show_default=True, type=float,
              help="> 0: divides the positive logits of the prompt's and output's tokens, multiplies the "
                   "negative ones; 1 = none.")
@click.option("--guide-type", type=click.Choice(["json", "json_schema", "regex", "ebnf_grammar"]),
              help="Guided decoding (TensorRT-LLM's guide types): the text must be JSON, match the "
                   "--guide schema, regular expression or EBNF grammar.")
@click.option("--guide", default=None,
              help="With --guide-type json_schema, regex or ebnf_grammar: the schema, expression or grammar, "
                   "or @FILE to read it from a file.")
@click.option("--drafter", "drafter_choice", type=click.Choice(["config", "none"]), default="config",
              show_default=True, help="`none` decodes autoregressively through the same target.")
@click.option("--cache-salt", default=None,
              help="With --url: vLLM's cache_salt, 1 to 1,024 characters: the server reuses a cached prompt "
                   "prefix and copies from its lookup pool only across requests with the same salt.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--flavour", type=click.Choice(["torch", "engine"]), default=None,
              help="Override the config's flavour; `engine` runs the exported ONNX graphs on onnxruntime.")
@run_errors
def generate(config_path, url, model_name, stream, chat, api_key, wait_s, prompt, max_tokens, temperature,
             top_p, top_k, min_p, seed, presence_penalty, frequency_penalty, repetition_penalty,
             guide_type, guide, drafter_choice, cache_salt, as_json, flavour=None) -> None:
    """Generate text speculatively with the configured target and drafter, or ask a served model."""
    utf8_text(prompt, "--prompt")
    if not prompt:
        raise click.BadParameter("must not be empty", param_hint="--prompt")
    check_range(max_tokens, "--max-tokens", low=1)
    check_range(wait_s, "--wait", low=0)
    if cache_salt is not None:
        from trtspec.triton.request import salt_length_problem

        utf8_text(cache_salt, "--cache-salt")
        problem = salt_length_problem(cache_salt)
        if problem is not None:
            raise click.BadParameter(problem, param_hint="--cache-salt")
    if (config_path is None) == (url is None):
        raise click.UsageError("give exactly one of --config (run here) or --url (a served model)")
    config = None
    if url is None:  # a mistaken config file is named before torch and the models load (seconds)
        if stream:
            raise click.BadParameter("streams only from a served model: add --url", param_hint="--stream")
        _refuse_given("applies to a served model (--url), not to --config", "model_name", "wait_s", "api_key",
                      "cache_salt")
        config = load_config_arg(config_path, "--config")
        if flavour is not None:
            config = _flavour_arg(config, flavour)
        if max_tokens > config.limits.max_tokens:
            raise click.BadParameter(f"must be in [1, {config.limits.max_tokens}] (limits.max_tokens of "
                                     f"{config_path}), got {max_tokens}", param_hint="--max-tokens")
    from trtspec.spec.sampling import SamplingParams

    sampling = options_model(SamplingParams, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                             seed=seed, presence_penalty=presence_penalty,
                             frequency_penalty=frequency_penalty, repetition_penalty=repetition_penalty)
    guide = _guide_args(guide_type, guide)
    if config is None:
        _url_arg(url)
        if drafter_choice != "config":
            raise click.BadParameter("the served model uses its build's drafter", param_hint="--drafter")
        if flavour is not None:
            raise click.BadParameter("the served model runs its build's flavour", param_hint="--flavour")
        if chat and not url.startswith("openai://"):
            raise click.BadParameter("chat needs an OpenAI-compatible server (openai://HOST:PORT)",
                                     param_hint="--chat")
        _generate_served(url, model_name, prompt, max_tokens, sampling, stream, wait_s, as_json, chat,
                         api_key, guide, cache_salt or "")
        return
    from trtspec.pipeline import load_pipeline
    from trtspec.runtime import configure_threads
    from trtspec.spec.decoder import Request

    configure_threads(config)
    sampling = sampling.model_copy(update={"coupling": config.sampling.coupling})
    pipeline = load_pipeline(config, use_drafter=drafter_choice != "none")
    decoder = pipeline.decoder
    try:
        decoder.check(Request(pipeline.tokenizer.encode(prompt), max_tokens))
    except ValueError as exc:  # prompt + max_tokens beyond the deployment's context, with the numbers
        raise click.BadParameter(str(exc), param_hint="--prompt / --max-tokens") from None
    from trtspec.spec.grammar import GuideError

    try:
        if chat:
            text, result = pipeline.chat([{"role": "user", "content": prompt}], max_tokens, sampling, guide)
        else:
            text, result = pipeline.generate(prompt, max_tokens, sampling, guide)
    except GuideError as exc:
        raise click.BadParameter(str(exc), param_hint="--guide") from None
    if as_json:
        lookup = pipeline.config.lookup  # prompt lookup, when on (not with --drafter none)
        click.echo(json.dumps({"text": text, "drafter": pipeline.drafter.method,
                               **({"lookup": lookup.model_dump()} if lookup else {}), **result.to_dict()}))
    else:
        click.echo(text)
        click.echo(
            f"[{pipeline.drafter.method}] tau={result.tau:.2f} "
            f"target_calls={result.num_target_calls} "
            f"decode={result.decode_tokens_per_s:.1f} tok/s" + _seed_note(result.seed),
            err=True,
        )


def _guide_args(guide_type: str | None, guide: str | None):
    """--guide-type and --guide as a `spec.grammar.Guide` (None: neither given); `@FILE` reads the
    guide from a file."""
    if guide_type is None:
        if guide is not None:
            raise click.BadParameter("needs --guide-type: json_schema, regex or ebnf_grammar",
                                     param_hint="--guide")
        return None
    from trtspec.spec.grammar import Guide, GuideError

    if guide is not None and guide.startswith("@"):
        path = Path(guide[1:])
        try:
            guide = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(f"cannot read {path}: {exc}", param_hint="--guide") from None
    if guide_type == "json" and guide:
        raise click.BadParameter("--guide-type json takes no --guide (any JSON); give a schema with "
                                 "--guide-type json_schema", param_hint="--guide")
    try:
        return Guide(guide_type, guide or "")
    except GuideError as exc:
        raise click.BadParameter(str(exc), param_hint="--guide") from None


def _flavour_arg(config, flavour: str):
    """`config` as `--flavour` runs it; a config that flavour cannot run is a usage error."""
    from trtspec.config import with_flavour

    try:
        return with_flavour(config, flavour)
    except TrtspecError as exc:
        raise click.BadParameter(f"{flavour}: {exc}", param_hint="--flavour") from None


def _concurrency_within_prompts(levels: list[int], tasks: list[str], prompts_per_task: int) -> None:
    """Refuse a `bench --concurrency` level above the prompts there are: R clients over fewer
    prompts never have R requests in flight, and the figures would be labelled R all the same (the
    in-process steady state, "every slot busy", would end after the first step)."""
    from trtspec.prompts import load_prompts

    count = sum(len(load_prompts(t)[:prompts_per_task]) for t in tasks)
    if levels and max(levels) > count:
        raise click.BadParameter(f"{max(levels)} exceeds the {count} prompts of this run (--prompts "
                                 f"{prompts_per_task} × --tasks {','.join(tasks)}): at most {count} "
                                 "requests can be in flight", param_hint="--concurrency")


def _refuse_given(why: str, *names: str) -> None:
    """A usage error naming the first of the current command's options `names` given on the command
    line (defaults and environment variables pass): an option that would be silently ignored."""
    ctx = click.get_current_context()
    given = click.core.ParameterSource.COMMANDLINE
    for param in ctx.command.params:
        if param.name in names and ctx.get_parameter_source(param.name) == given:
            raise click.BadParameter(why, param_hint=param.opts[0])


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


def _seed_note(seed: int | None) -> str:
    """The summary line's seed of a sampled request (drawn when none was given): --seed repeats it."""
    return "" if seed is None else f" seed={seed}"


def _generate_served(url, model_name, prompt, max_tokens, sampling, stream, wait_s, as_json, chat,
                     api_key, guide=None, cache_salt: str = "") -> None:
    from trtspec.triton.client import GenerateParams, generate, wait_ready

    if wait_s > 0:
        wait_ready(url, model_name, wait_s, api_key)
    import dataclasses

    # `of` leaves a greedy request's sampling fields to the server; this sends them all
    params = dataclasses.replace(GenerateParams.of(sampling, max_tokens, stream),
                                 temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                                 min_p=sampling.min_p or None, seed=sampling.seed,
                                 guide=None if guide is None else (guide.kind, guide.text),
                                 cache_salt=cache_salt)
    on_text = None if as_json or not stream else (lambda text: click.echo(text, nl=False))
    completion = generate(url, model_name, prompt, params, on_text, chat=chat, api_key=api_key)
    tau, decode = completion.tau, completion.decode_tokens_per_s
    if as_json:  # null: not measured (no draft figures from the server, no decode phase to time)
        click.echo(json.dumps({
            "text": completion.text, "token_ids": completion.token_ids, "tokens": completion.num_tokens,
            "finish_reason": completion.finish_reason, "tau": None if tau is None else round(tau, 4),
            "accepted_tokens": completion.accepted_tokens, "draft_tokens": completion.draft_tokens,
            "target_forwards": completion.target_forwards, "cached_tokens": completion.cached_tokens,
            "tokens_per_s": round(completion.tokens_per_s, 2),
            "decode_tokens_per_s": None if decode is None else round(decode, 2),
            "responses": completion.num_responses,
            **({} if completion.seed is None else {"seed": completion.seed}),
        }))
        return
    click.echo("" if stream else completion.text)
    speculative = "" if tau is None else \
        f" tau={tau:.2f} accepted={completion.accepted_tokens}/{completion.draft_tokens}"
    click.echo(
        f"[{url}]{speculative} tokens={completion.num_tokens} "
        f"{completion.tokens_per_s:.1f} tok/s end to end"
        + ("" if decode is None else f", decode={decode:.1f} tok/s")
        + _seed_note(completion.seed),
        err=True,
    )


@main.group()
def train() -> None:
    """Train the embedded models and drafters."""


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
    ids = _int_list(target_layer_ids, "--target-layer-ids", low=0) if target_layer_ids else None
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
    ids = _int_list(aux_layer_ids, "--aux-layer-ids", low=0) if aux_layer_ids else None
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
    ids = _int_list(target_layer_ids, "--target-layer-ids", low=0) if target_layer_ids else None
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
    from trtspec.train.calibrate import calibrate as run_calibrate
    from trtspec.train.calibrate import pooled_ece

    check_range(response_tokens, "--response-tokens", low=1)
    check_range(bins, "--bins", low=2, high=1000)
    cal = run_calibrate(drafter_dir, target_dir, _tasks_arg(tasks), response_tokens, bins)
    before, after = pooled_ece(cal)
    click.echo(f"STS temperatures: {cal.temperatures}")
    click.echo(f"held-out ECE of survival per slot before: {cal.ece_before}")
    click.echo(f"held-out ECE of survival per slot after:  {cal.ece_after}")
    click.echo(f"mean ECE before {before:.4f} after {after:.4f} ({cal.source}); "
               f"written to {drafter_dir / 'sts.json'}")


@main.command()
@click.argument("configs", nargs=-1, type=PathArg(path_type=Path))
@click.option("--tasks", default="code,math,chat", show_default=True, help="Comma-separated prompt sets.")
@click.option("--prompts", "prompts_per_task", default=8, show_default=True, type=int,
              help="Prompts per task.")
@click.option("--max-tokens", default=256, show_default=True, type=int, help="Tokens per prompt.")
@click.option("--repeats", default=1, show_default=True, type=int, help="Interleaved repetitions.")
@click.option("--no-hf", is_flag=True, help="Skip the transformers reference columns.")
@click.option("--out", "out_dir", default=Path("bench-out"), show_default=True,
              type=PathArg(path_type=Path),
              help="Folder for results.json, results.md and the plots; they replace an earlier run's once "
                   "all are measured, other files are left alone.")
@click.option("--doc", "doc_path", default=None, type=PathArg(path_type=Path),
              help="Also write this Markdown report (e.g. docs/BENCHMARKS.md).")
@click.option("--concurrency", default=None,
              help="Also serve the prompts as R concurrent clients (R in flight, the next joining as one "
                   "finishes), for each R in this comma-separated list (1,2,4,8).")
@click.option("--min-user-tps", default=None, type=float,
              help="Recommendation: least tokens/s per user; default the target alone at concurrency 1.")
@click.option("--max-users", default=None, type=int, help="Recommendation: most concurrent users.")
@click.option("--sps", "sps_path", default=None, type=EXISTING_FILE,
              help="Cost table from `trtspec profile` for every drafter's adaptive and scheduler methods; "
                   "default: each config's schedule.sps_table, else measured in this run.")
@click.option("--url", default=None,
              help="Benchmark a running server instead: TTFT, ITL, tokens/s (grpc://HOST:PORT or "
                   "http://HOST:PORT for Triton, openai://HOST:PORT for any OpenAI-compatible server).")
@click.option("--model", "model_name", default="trtspec", show_default=True, help="Served model (--url).")
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(0),
              help="With --url: requests sent first, one at a time, and not counted (a server's first "
                   "requests pay its start-up), with the tasks' prompts past those measured.")
@click.option("--chat", is_flag=True, help="With openai://: stream /v1/chat/completions (each prompt one "
              "user message) instead of /v1/completions.")
@click.option("--salt-per-level", is_flag=True,
              help="With --url: each concurrency level's requests carry a cache_salt of their own (trtspec's "
                   "and vLLM's servers), so what the server cached of earlier levels' prompts (prefix reuse, "
                   "a lookup pool) is not reused: as a restart per level.")
@click.option("--api-key", envvar="OPENAI_API_KEY", default=None,
              help="With openai://: bearer token (env OPENAI_API_KEY).")
@click.option("--tree", "tree_spec", default=None, metavar="auto|N,K",
              help="Also run each drafter with a draft tree (method NAME+tree): auto = N nodes sized by "
                   "this machine's cost table (tree verification ≤ 1.1 × the chain's), K = 8; or N,K. A "
                   "config with drafter.tree always gets its tree row.")
@click.option("--write-acceptance", is_flag=True,
              help="Store each drafter's measured acceptance by position as acceptance.json beside its "
                   "weights (the cost model of `trtspec build`/`inspect` and adaptive serving reads it); "
                   "a stored file measured over more cycles is kept, and the run then ends in an error "
                   "saying so (the results are written).")
@click.option("--temperature", default=0.0, show_default=True, type=float,
              help="0 = greedy; > 0 samples every method at this temperature, prompt i with seed SEED + i.")
@click.option("--top-p", default=1.0, show_default=True, type=float, help="Nucleus mass, (0, 1].")
@click.option("--top-k", default=0, show_default=True, type=int, help="Keep k most likely; 0 = all.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**64 - 1),
              help="Seed of the first prompt when sampling (prompt i: SEED + i, modulo 2^64).")
@click.option("--coupling", type=click.Choice(["rejection", "gumbel", "both"]), default=None,
              help="When sampling: how every drafter verifies (default: each config's sampling.coupling); "
                   "both = each drafter twice, NAME (rejection) and NAME+gumbel. Gumbel-coupled texts must "
                   "equal the target alone's (method none+gumbel) token for token.")
@run_errors
def bench(configs, tasks, prompts_per_task, max_tokens, repeats, no_hf, out_dir, doc_path, concurrency,
          min_user_tps, max_users, sps_path, url, model_name, warmup, chat, salt_per_level, api_key,
          tree_spec, write_acceptance, temperature, top_p, top_k, seed, coupling) -> None:
    """Benchmark the drafters of CONFIGS (same target) against the target alone, side by side;
    or, with --url, a running server as its users see it."""
    from trtspec.bench.outputs import bench_outputs
    from trtspec.bench.run import check_same_target, load_methods, markdown_table, run_bench
    from trtspec.bench.sampled import with_couplings
    from trtspec.config import method_name
    from trtspec.pipeline import check_served_files
    from trtspec.runtime import configure_threads
    from trtspec.spec.sampling import SamplingParams

    levels = _int_list(concurrency, "--concurrency") if concurrency else []
    task_names = _tasks_arg(tasks)
    if min_user_tps is not None:
        check_range(min_user_tps, "--min-user-tps", low=0)
    if max_users is not None:
        check_range(max_users, "--max-users", low=1)
    for name, value in (("--prompts", prompts_per_task), ("--max-tokens", max_tokens),
                        ("--repeats", repeats)):
        check_range(value, name, low=1)
    _concurrency_within_prompts(levels, task_names, prompts_per_task)
    writable_arg(out_dir, "--out", folder=True)
    if doc_path is not None:
        writable_arg(doc_path, "--doc", folder=False)
    tree = tree_spec if tree_spec in (None, "auto") else _tree_option(tree_spec)
    sampling = options_model(SamplingParams, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    if coupling is not None and sampling.greedy:
        raise click.BadParameter("applies when sampling: give --temperature > 0 too", param_hint="--coupling")
    if write_acceptance and not sampling.greedy:
        raise click.BadParameter("stores the greedy acceptance that adaptive serving's cost model reads: "
                                 "measure it at --temperature 0", param_hint="--write-acceptance")
    if url is not None:
        if write_acceptance:
            raise click.BadParameter("measures drafters run here, not a server",
                                     param_hint="--write-acceptance")
        if coupling is not None:
            raise click.BadParameter("a server verifies by its build config's sampling.coupling",
                                     param_hint="--coupling")
        from trtspec.bench.remote import remote_table, run_remote

        _url_arg(url)
        _refuse_given("applies to drafters run here (CONFIGS), not to --url", "repeats", "no_hf", "doc_path",
                      "sps_path", "tree_spec", "min_user_tps", "max_users")
        if configs:
            raise click.UsageError("give CONFIGS (run here) or --url (a running server), not both")
        if not url.startswith("openai://") and chat:
            raise click.BadParameter("chat needs an OpenAI-compatible server (openai://HOST:PORT)",
                                     param_hint="--chat")
        remote = run_remote(url, model_name, task_names, prompts_per_task, max_tokens, levels or [1],
                            chat, api_key, sampling, warmup, salt_per_level)
        with bench_outputs(out_dir) as staged:
            (staged / "results.json").write_text(json.dumps({"remote": remote}, indent=1), encoding="utf-8")
            (staged / "results.md").write_text(remote_table(remote) + "\n", encoding="utf-8")
        click.echo(remote_table(remote))
        return
    if not configs:
        raise click.UsageError("give at least one CONFIG (or --url to benchmark a running server)")
    _refuse_given("applies to a served model (--url), not to CONFIGS", "model_name", "warmup", "chat",
                  "salt_per_level", "api_key")
    if not levels:
        _refuse_given("applies to the concurrent runs: give --concurrency too", "sps_path", "min_user_tps",
                      "max_users")
    loaded = {}
    for path in configs:
        cfg = load_config_arg(path, "CONFIGS")
        if cfg.drafter is None and cfg.lookup is None:
            raise click.BadParameter(f"{path} has no drafter and no lookup", param_hint="CONFIGS")
        if write_acceptance and cfg.drafter is None:
            raise click.BadParameter(f"{path} has no drafter, whose acceptance --write-acceptance stores",
                                     param_hint="CONFIGS")
        name = method_name(cfg)
        k = cfg.drafter.num_draft_tokens if cfg.drafter else cfg.lookup.num_draft_tokens
        if name in loaded and k:  # one method twice: EAGLE-3 at k = 7 and 16, lookup copying 4 or 8
            name = f"{name}-k{k}"
        if name in loaded:
            raise click.BadParameter(f"{path} repeats the drafter of another config", param_hint="CONFIGS")
        loaded[name] = cfg
    loaded = with_couplings(loaded, sampling, coupling)
    check_same_target(loaded)
    for cfg in loaded.values():  # what the concurrency runs read only after the single-stream ones
        check_served_files(cfg)
    if write_acceptance:
        dirs = [c.drafter.resolved_path for c in loaded.values()]
        if len(set(dirs)) != len(dirs):
            raise click.BadParameter("two configs share a drafter: keep the one with the longest draft",
                                     param_hint="--write-acceptance")
    sps = _sps_arg(sps_path) if levels and sps_path is not None else None  # before the long run
    configure_threads(next(iter(loaded.values())))  # the configs share their target
    pipelines = load_methods(loaded)  # once, for the table and the concurrent runs
    results = run_bench(loaded, task_names, prompts_per_task, max_tokens, repeats, not no_hf, tree, sampling,
                        pipelines)
    if levels:
        from trtspec.bench.concurrency import recommendation_text, run_concurrency

        results["concurrency"] = run_concurrency(loaded, task_names, prompts_per_task, max_tokens,
                                                 levels, sps, sampling, pipelines)
        if min_user_tps is None:
            min_user_tps = results["concurrency"]["methods"]["none"][str(levels[0])]["per_user_tokens_per_s"]
        results["recommendation"] = recommendation_text(results["concurrency"], min_user_tps, max_users)
    from trtspec.bench.report import headline, write_plots, write_report

    table = markdown_table(results) + "\n\n" + "\n".join(headline(results))
    command = "trtspec " + " ".join(sys.argv[1:])
    with bench_outputs(out_dir) as staged:
        (staged / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
        (staged / "results.md").write_text(table + "\n", encoding="utf-8")
        plots = [out_dir / p.name for p in write_plots(results, staged)]
    if doc_path is not None:
        write_report(results, plots, command, doc_path)
    click.echo(table)
    if "recommendation" in results:
        click.echo(results["recommendation"])
    if write_acceptance:
        from trtspec.bench.acceptance import replace_refusal
        from trtspec.bench.acceptance import write_acceptance as write

        refused = []
        for name, cfg in loaded.items():
            measured = results["acceptance"][name]
            why = replace_refusal(cfg.drafter.resolved_path, measured["cycles"])
            if why is not None:
                refused.append(why)
                continue
            path = write(cfg.drafter.resolved_path, measured["conditional"], measured["cycles"], command)
            click.echo(f"wrote {path} ({measured['cycles']} cycles)")
        if refused:
            raise click.ClickException("\n".join(refused))


def _tree_option(text: str):
    """`--tree N,K` as a TreeConfig, or a usage error naming the option."""
    from pydantic import ValidationError

    from trtspec.config import TreeConfig

    values = _int_list(text, "--tree", distinct=False)
    if len(values) != 2:
        raise click.BadParameter(f"expected auto or N,K (nodes, top-k), got {text!r}", param_hint="--tree")
    try:
        return TreeConfig(nodes=values[0], topk=values[1])
    except ValidationError as exc:
        first = exc.errors()[0]
        raise click.BadParameter(f"{first['loc'][0]}: {first['msg']}", param_hint="--tree") from None


def _sps_arg(path: Path):
    from trtspec.spec.schedule import SPSTable

    try:
        return SPSTable.load(path)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--sps") from None


def _int_list(text: str, hint: str, low: int = 1, distinct: bool = True) -> list[int]:
    """A comma-separated list of integers >= low; with `distinct` each value once (`_each_once`)."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected integers like 1,2,4,8, got {text!r}", param_hint=hint) from None
    if min(values) < low:
        raise click.BadParameter(f"values must be >= {low}, got {text!r}", param_hint=hint)
    if distinct:
        _each_once(values, text, hint)
    return values


@main.command()
@click.argument("config_path", metavar="[CONFIG]", required=False, type=PathArg(path_type=Path))
@click.option("--out", "out_path", required=True, type=PathArg(path_type=Path),
              help="JSON file: the cost table (point the config's drafter.schedule.sps_table at it), or "
              "with --synthetic the cost curve (a Markdown table is written beside it).")
@click.option("--batches", default=None, help="Comma-separated verify batch sizes B (tokens).")
@click.option("--requests", default=8, show_default=True, type=int,
              help="Sequences sharing the cache, in [1, 256].")
@click.option("--context", default=256, show_default=True, type=int, help="Cached tokens per sequence.")
@click.option("--reps", default=None, type=int, help="Repetitions per measurement (median kept), at most "
              "10,000 with CONFIG; default 15, with --synthetic 10 (3 at --scale small).")
@click.option("--synthetic", "synthetic_model", default=None, metavar="MODEL",
              help="Instead of CONFIG: time a real architecture with random weights made on the device "
              "(qwen3-8b, llama3.1-8b): target forwards, DFlash draft step, plugin kernels, projected "
              "speedups.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="With --synthetic: where to run; auto = cuda when visible.")
@click.option("--scale", type=click.Choice(["auto", "full", "small"]), default="auto", show_default=True,
              help="With --synthetic: full = the published architecture, small = scaled down; "
              "auto = small on the CPU.")
@click.option("--batch-sizes", default=None,
              help="With --synthetic: sequences per forward, e.g. 1,2,4,8,16,32.")
@click.option("--contexts", default=None,
              help="With --synthetic: cached tokens per sequence, e.g. 1024,8192.")
@click.option("--new-tokens", default=None,
              help="With --synthetic: tokens per forward, e.g. 1,2,4,8,16,32,64.")
@click.option("--budget-s", default=None, type=float,
              help="With --synthetic: seconds to spend; the rest is skipped.")
@run_errors
def profile(config_path, out_path, batches, requests, context, reps, synthetic_model, device, scale,
            batch_sizes, contexts, new_tokens, budget_s) -> None:
    """Measure CONFIG's cost model on this machine (target steps/s at each verify batch size B and
    the drafter's seconds per step at each batch size and draft length: adaptive speculation and
    DSpark's scheduler read it), or with --synthetic MODEL the real-size cost curve behind a
    speedup claim."""
    writable_arg(out_path, "--out", folder=False)
    if config_path is not None and out_path.resolve() == Path(config_path).resolve():
        raise click.BadParameter(f"{out_path} is CONFIG itself; give the cost table a path of its own",
                                 param_hint="--out")
    if synthetic_model is not None:
        if config_path is not None:
            raise click.UsageError("give either CONFIG or --synthetic MODEL, not both")
        _synthetic_outputs(out_path)
        _refuse_given("applies to CONFIG's cost table, not to --synthetic (its shapes are --batch-sizes, "
                      "--contexts, --new-tokens)", "batches", "requests", "context")
        _profile_synthetic(synthetic_model, out_path, device, scale, reps, batch_sizes, contexts, new_tokens,
                           budget_s)
        return
    if config_path is None:
        raise click.UsageError("missing CONFIG (or --synthetic MODEL)")
    _refuse_given("applies with --synthetic MODEL, not to CONFIG", "device", "scale", "batch_sizes",
                  "contexts", "new_tokens", "budget_s")
    from trtspec.bench.profile import DEFAULT_BATCHES, profile_cost
    from trtspec.pipeline import load_pipeline
    from trtspec.runtime import configure_threads

    config = load_config_arg(config_path, "CONFIG")
    sizes = _int_list(batches, "--batches") if batches else None
    reps = 15 if reps is None else reps
    for name, value, most in (("--requests", requests, 256), ("--context", context, None),
                              ("--reps", reps, 10_000)):  # 10^8 requests or reps: an allocation of terabytes
        check_range(value, name, low=1, high=most)
    positions = _max_positions(config)
    longest = context + max(sizes or DEFAULT_BATCHES)  # a slot holds the context and a whole verify batch
    if positions is not None and longest > positions:  # named: the one past the positions alone, else both
        hint = "--batches" if sizes and max(sizes) >= positions else \
            "--context" if context >= positions else "--context / --batches"
        raise click.BadParameter(f"{context} cached tokens plus a verify batch of {longest - context} exceed "
                                 f"the target's {positions} positions", param_hint=hint)
    configure_threads(config)
    pipeline = load_pipeline(config)
    table = profile_cost(pipeline.target, pipeline.drafter, sizes, requests, context, reps,
                         max_batch=config.limits.max_concurrency)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    table.save(out_path)
    for b, s in zip(table.batch_tokens, table.steps_per_s, strict=True):
        click.echo(f"B={b:4d}  {s:8.1f} steps/s  {b * s:9.1f} tokens/s")
    for r, row in zip(table.draft_batches, table.draft_seconds, strict=True):
        cells = "  ".join(f"k={k}: {sec * 1e3:.2f} ms" for k, sec in zip(table.draft_lens, row, strict=True))
        click.echo(f"drafter R={r:3d}  {cells}")
    if table.catch_up_seconds:
        pairs = zip(table.draft_batches, table.catch_up_seconds, strict=True)
        cells = "  ".join(f"R={r}: {sec * 1e6:.1f} µs" for r, sec in pairs)
        click.echo(f"drafter catch-up per pending position and request: {cells}")
    if pipeline.drafter.num_draft_tokens:
        from trtspec.spec.cost import tree_budget

        k = pipeline.drafter.num_draft_tokens
        click.echo(f"draft tree budget: {tree_budget(table, k)} nodes verify in at most 1.1 × the time of "
                   f"the {k}-token chain here (drafter.tree.nodes)")
    click.echo(f"wrote {out_path}")


def _max_positions(config) -> int | None:
    """The target checkpoint's `max_position_embeddings`, when its config.json says."""
    config_file = config.target.resolved_path / "config.json"
    try:
        return int(json.loads(config_file.read_text(encoding="utf-8"))["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _synthetic_outputs(out_path: Path) -> None:
    """Refuse a --synthetic --out whose Markdown twin (the same path with .md) is the JSON itself, a
    folder, or a file the run did not write before (a README.md beside --out README.json): it would
    be replaced, after the whole measurement."""
    from trtspec.bench.synthetic_report import markdown_path

    md = markdown_path(out_path)
    if md == out_path:
        raise click.BadParameter(f"{out_path}: the profile is JSON with its Markdown beside it as {md.name}; "
                                 "give a .json path", param_hint="--out")
    writable_arg(md, "--out (its Markdown twin)", folder=False)
    if md.exists() and not out_path.exists():
        raise click.BadParameter(f"the profile's Markdown would replace {md}, which no profile at {out_path} "
                                 "wrote; choose another --out", param_hint="--out")


def _profile_synthetic(model, out_path, device, scale, reps, batch_sizes, contexts, new_tokens,
                       budget_s) -> None:
    import torch

    from trtspec.bench.synthetic import MEASUREMENTS, SyntheticSettings, profile_synthetic, resolve_model
    from trtspec.bench.synthetic_report import render_markdown, write_outputs

    try:
        resolve_model(model)
    except TrtspecError as exc:
        raise click.BadParameter(str(exc), param_hint="--synthetic") from None
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter("no CUDA device is visible here", param_hint="--device")
    if scale == "auto":
        scale = "full" if device == "cuda" else "small"
    overrides: dict = {}
    for name, text, hint in (("batches", batch_sizes, "--batch-sizes"), ("contexts", contexts, "--contexts"),
                             ("new_tokens", new_tokens, "--new-tokens")):
        if text:
            overrides[name] = _int_list(text, hint)
    for name, value, hint in (("reps", reps, "--reps"), ("budget_s", budget_s, "--budget-s")):
        if value is not None:
            if not value > 0:  # nan too (it was the first line of a pydantic error, exit 1)
                raise click.BadParameter(f"must be > 0, got {value}", param_hint=hint)
            overrides[name] = value
    settings = SyntheticSettings.small(**overrides) if scale == "small" else SyntheticSettings(**overrides)
    result = profile_synthetic(model, settings, device)
    if not any(result[name] for name in MEASUREMENTS):
        hint = ": give a larger --budget-s" if any("time budget" in why for why in result["skipped"]) else ""
        raise click.ClickException(f"nothing was measured ({'; '.join(result['skipped'][:2])}; ...); "
                                   f"{out_path} is not written{hint}")
    md_path = write_outputs(result, out_path)
    click.echo(render_markdown(result))
    click.echo(f"wrote {out_path} and {md_path}")


@main.command()
@click.argument("config_path", metavar="CONFIG", type=PathArg(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
@run_errors
def inspect(config_path, as_json) -> None:
    """Plan CONFIG's memory per GPU (weights after TP/PP/EP, drafter, KV cache, what fits) and its
    speculation under load (draft length per batch size, predicted tokens/s with and without)."""
    from trtspec.plan.memory import PlanError, check_fits, format_plan
    from trtspec.plan.speculation import format_speculation, plan_speculation
    from trtspec.trtllm.build import plan_config
    from trtspec.trtllm.fields import DECODING_TYPE, DYNAMIC_DRAFT_LEN_TYPES

    config = load_config_arg(config_path, "CONFIG")
    plan = plan_config(config)
    spec = plan_speculation(config) if config.drafter is not None else None
    try:  # what `build` refuses, said here too (inspect said "fit" of a config build refused)
        check_fits(plan, config.deployment.min_concurrency, f"config {config.name!r}")
        refused = None
    except PlanError as exc:
        refused = str(exc)
    if as_json:
        out = {**plan.to_dict(), "build_refuses": refused}
        if spec is not None:
            out["speculation"] = {
                "max_draft_len": spec.max_draft_len, "acceptance_by_position": spec.acceptance,
                "acceptance_source": spec.acceptance_source, "draft_len_schedule": spec.draft_len_schedule,
                "acceptance_rate_threshold": spec.acceptance_rate_threshold,
                "acceptance_rate_window_size": spec.acceptance_rate_window_size,
                "tokens_per_s": {k: [round(v, 1) for v in vals] for k, vals in spec.tokens_per_s.items()},
            }
        click.echo(json.dumps(out))
        return
    click.echo(format_plan(plan, config.deployment))
    if refused is not None:
        click.echo(f"build     refuses it: {refused}")
    if spec is not None and not plan.weights_fit:
        click.echo("speculation not planned: the weights do not fit")
    elif spec is not None:
        full = config.drafter.schedule.mode == "full"
        written = (config.flavour == "trtllm" and not full
                   and DECODING_TYPE[config.drafter.method] in DYNAMIC_DRAFT_LEN_TYPES)
        click.echo(format_speculation(spec, config.deployment.max_batch_size, written, full))


@main.command()
@click.argument("config_path", metavar="CONFIG", type=PathArg(path_type=Path))
@click.option("--out", "out_dir", required=True, type=PathArg(path_type=Path),
              help="Folder for the generated artifacts: new, empty, or an earlier build's, which is replaced "
                   "whole once this build is complete (any other folder is refused).")
@click.option("--flavour", type=click.Choice(["torch", "engine", "trtllm"]), default=None,
              help="Override the config's flavour.")
@run_errors
def build(config_path, out_dir, flavour=None) -> None:
    """Build CONFIG's deployment artifacts into OUT, which `build` owns: it refuses a non-empty
    folder it did not write and replaces its own earlier output as a whole. Flavour torch: a
    Triton model repository (OUT/model_repository) for `trtspec serve`; engine: ONNX graphs, a
    manifest and the repository serving them; trtllm: TensorRT-LLM configs, Triton repo, launchers."""
    from trtspec.output import OutputError, check_replaceable, moved, staged_output

    config = load_config_arg(config_path, "CONFIG")
    if flavour is not None:
        config = _flavour_arg(config, flavour)
    try:
        check_replaceable(out_dir)
    except OutputError as exc:
        raise click.BadParameter(str(exc).removeprefix("--out "), param_hint="--out") from None
    if config.flavour in ("torch", "engine"):  # served by Triton's Python backend
        from trtspec.pipeline import check_served_files
        from trtspec.triton.repo import check_stub_paths

        check_stub_paths({"--out": out_dir, "target.path": config.target.resolved_path,
                          "drafter.path": config.drafter and config.drafter.resolved_path,
                          "drafter.schedule.sps_table": config.drafter and config.drafter.resolved_sps_table})
        check_served_files(config)
    if config.flavour == "engine":
        from trtspec.engine.build import build_engine_flavour

        written, note = build_engine_flavour(config, out_dir)
        notes = [note] if note else []
    elif config.flavour == "torch":
        from trtspec.openai.model_info import served_model
        from trtspec.pipeline import load_pipeline
        from trtspec.runtime import configure_threads
        from trtspec.triton.repo import write_triton_repo

        configure_threads(config)
        # the served model loads exactly this: a drafter that does not fit, or K/V slots that do not, fail now
        load_pipeline(config).check_buffers(config.limits.max_concurrency)
        served_model(config)  # ... and the OpenAI frontend this (the chat template, generation_config)
        with staged_output(out_dir) as staged:
            written = moved(write_triton_repo(config, staged), staged, out_dir)
        notes = []
    else:
        from trtspec.trtllm.build import build_trtllm, drafter_note

        with staged_output(out_dir) as staged:
            written = moved(build_trtllm(config, staged), staged, out_dir)
        notes = [n for n in (drafter_note(config, out_dir),) if n]
    for path in written:
        click.echo(str(path))
    for note in notes:
        click.echo(note, err=True)


@main.command()
@click.argument("build_dir", metavar="DIR", type=PathArg(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; 0.0.0.0 exposes the server to the network (admin APIs then need a key).")
@click.option("--http-port", default=8000, show_default=True, type=PORT, help="HTTP/REST port.")
@click.option("--grpc-port", default=8001, show_default=True, type=PORT, help="gRPC port.")
@click.option("--metrics-port", default=8002, show_default=True, type=PORT, help="Prometheus metrics port.")
@click.option("--openai-port", default=9000, show_default=True, type=PORT,
              help="Port of the OpenAI-compatible API (/v1/completions, /v1/chat/completions, "
                   "/v1/responses; Anthropic's /v1/messages).")
@click.option("--no-openai", is_flag=True, help="Serve Triton's endpoints only.")
@click.option("--api-key", envvar="TRTSPEC_API_KEY", default=None,
              help="Require `Authorization: Bearer KEY` on the OpenAI API, and header `admin-key: KEY` on "
                   "Triton's admin APIs (env TRTSPEC_API_KEY).")
@click.option("--tool-call-parser", type=click.Choice(("hermes", "llama3_json", "qwen3_coder")), default=None,
              help="How the OpenAI API finds tool calls in the model's text under tool_choice \"auto\" (the "
                   "default with tools): hermes, <tool_call>{...}</tool_call> (Qwen2.5's, Qwen3's); "
                   "llama3_json, an answer of {\"name\", \"parameters\"} objects (Llama 3.1's); qwen3_coder, "
                   "<tool_call><function=NAME><parameter=ARG>... (Qwen3-Coder's, Qwen3.5's). Without it "
                   "auto is refused; \"required\" and named functions need none.")
@click.option("--reasoning-parser", type=click.Choice(("qwen3", "deepseek_r1", "deepseek-r1")), default=None,
              help="Give a thinking model's <think>...</think> block as the chat answer's reasoning_content, "
                   "the text after it as content (structured outputs and tool calls then hold the content): "
                   "qwen3, a block the answer opens (or the template did); deepseek_r1, the answer up to "
                   "</think>.")
@click.option("--allowed-origin", "allowed_origins", multiple=True, callback=_origins, metavar="ORIGIN",
              help="Let scripts of web pages from ORIGIN (scheme://host[:port], e.g. http://localhost:5173; "
                   "* for any) call the OpenAI API from a browser (CORS); repeatable. None by default.")
@click.option("--compact-json", is_flag=True,
              help="Structured outputs (response_format json_schema or json_object, Responses' text.format, "
                   "Messages' output_config.format, guided_json) are JSON written compactly, as json.dumps "
                   "writes it, where a model could pad it with whitespace without end (small models do); "
                   "vLLM's disable_any_whitespace, which a request may also set in structured_outputs.")
@click.option("--served-model-name", "served_names", multiple=True, callback=_served_names, metavar="NAME",
              help="A name the OpenAI API answers to, in place of the model's own (repeatable: any of them; "
                   "answers carry the first), as vLLM's --served-model-name: for clients that send a "
                   "fixed model name.")
@click.option("--log-file", type=PathArg(dir_okay=False, path_type=Path), default=None,
              help="Write tritonserver's log, the model's own messages with it (a failed step's "
                   "traceback), to FILE (replaced). Default: a temporary file, removed at exit; the "
                   "`serving` line names it.")
@run_errors
def serve(build_dir, host, http_port, grpc_port, metrics_port, openai_port, no_openai, api_key,
          tool_call_parser, reasoning_parser, allowed_origins, compact_json, served_names, log_file) -> None:
    """Serve DIR (the output of `trtspec build`) with the tritonserver of the nvidia-pytriton wheel,
    and an OpenAI-compatible API beside it, until Ctrl-C or SIGTERM. Prints `serving …` once the
    server and its models are ready."""
    import signal

    from trtspec.openai.reasoning import parser_name
    from trtspec.serve import (
        admin_key_for,
        exit_quickly,
        model_repository,
        start_openai_frontend,
        wait_for_exit,
    )
    from trtspec.triton.server import Ports, TritonServer, check_port_free

    if api_key is not None and not api_key:
        raise click.BadParameter("must not be empty", param_hint="--api-key")
    ports = {"--http-port": http_port, "--grpc-port": grpc_port, "--metrics-port": metrics_port}
    if not no_openai:
        ports["--openai-port"] = openai_port
    if len(set(ports.values())) < len(ports):
        raise click.UsageError(", ".join(f"{k} {v}" for k, v in ports.items()) + " must all differ")
    if not no_openai:  # Triton checks its own ports; this one would fail only after the models load
        check_port_free(host, openai_port, "OpenAI API", "--openai-port")
    if log_file is not None:
        writable_arg(log_file, "--log-file", folder=False)

    def _terminate(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    admin_key, generated = admin_key_for(host, api_key)
    server = TritonServer(model_repository(build_dir), host, Ports(http_port, grpc_port, metrics_port),
                          log_path=log_file, admin_key=admin_key)
    frontend = None
    try:
        server.start()
        urls, why_not = f"{server.http_url} {server.grpc_url} {server.metrics_url}", None
        if not no_openai:
            frontend, why_not = start_openai_frontend(server, openai_port, api_key, tool_call_parser,
                                                     parser_name(reasoning_parser), allowed_origins,
                                                     compact_json, served_names)
            urls += f" {frontend.url}/v1" if frontend else ""
        click.echo(f"serving {server.repo}: {urls} (log: {server.log_path})", err=True)
        if why_not:
            click.echo(why_not, err=True)
        if generated:
            click.echo(f"Triton's admin APIs need header `admin-key: {admin_key}` (--api-key sets it)",
                       err=True)
        code = wait_for_exit(server)
        raise click.ClickException(f"tritonserver exited with {code}: {server.failure()}")
    except KeyboardInterrupt:
        click.echo("stopping tritonserver", err=True)
    finally:
        if frontend is not None:
            frontend.stop()
        server.stop()
        exit_quickly()


@main.command()
@click.argument("build_dir", metavar="[DIR]", required=False, type=EXISTING_DIR)
@click.option("--url", default=None, help="Check a running server instead of starting one on DIR: "
              "grpc://HOST:PORT or http://HOST:PORT (Triton), openai://HOST:PORT (any OpenAI-compatible "
              "server: trtspec, trtllm-serve, vLLM, SGLang).")
@click.option("--config", "config_path", default=None, type=PathArg(path_type=Path),
              help="Build config of the reference target (default: the one inside DIR; needed with --url "
                   "alone).")
@click.option("--model", "model_name", default=None, help="Served model name (default: the config's name).")
@click.option("--prompts", "prompts_path", default=None, type=EXISTING_FILE,
              help="JSONL with a `prompt` per line, or text with one prompt per line.")
@click.option("--max-tokens", default=48, show_default=True, type=int, help="Tokens per greedy prompt.")
@click.option("--samples", default=2000, show_default=True, type=int,
              help="Seeded sampling requests for the distribution test (at least 100; 2000 catch slips "
                   "that move a token's law by 0.05-0.1, docs/EVAL.md); 0 skips it.")
@click.option("--api-key", envvar="OPENAI_API_KEY", default=None,
              help="With openai://: bearer token (env OPENAI_API_KEY).")
@run_errors
def verify(build_dir, url, config_path, model_name, prompts_path, max_tokens, samples, api_key) -> None:
    """Certify a deployment as lossless: greedy token identity with the target alone on every prompt
    (a bfloat16/float16 deployment may differ at a near-tie of the target's two best tokens: it
    passes when an audit finds every served token the target's argmax up to its rounding), greedy
    identity under penalties and under a guide, and sampling distribution tests (plain, under a
    guide, under penalties, min-p and a logit bias); exits 1 on any mismatch. Give DIR (a `trtspec
    build` output, served here on free loopback ports) or --url of a running server with --config."""
    from trtspec.runtime import configure_threads
    from trtspec.serve import model_repository
    from trtspec.triton.repo import BUILD_CONFIG_FILE, VERSION
    from trtspec.triton.server import Ports, TritonServer
    from trtspec.triton.verify import DEFAULT_PROMPTS, certify, check_samples

    if build_dir is None and url is None:
        raise click.UsageError("give DIR (a `trtspec build` output) or --url of a running server")
    if url is not None:
        _url_arg(url)
    if url is None or not url.startswith("openai://"):  # Triton's endpoints take no key
        _refuse_given("applies to an OpenAI-compatible server (--url openai://…)", "api_key")
    check_range(max_tokens, "--max-tokens", low=1)
    check_range(samples, "--samples", low=0)
    try:
        check_samples(samples)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--samples") from None
    if config_path is None:
        if build_dir is None:
            raise click.BadParameter("needed with --url alone: the reference target's config",
                                     param_hint="--config")
        found = sorted(model_repository(build_dir).glob(f"*/{VERSION}/{BUILD_CONFIG_FILE}"))
        if len(found) != 1:
            raise click.BadParameter(f"expected one model with {BUILD_CONFIG_FILE} in {build_dir}, found "
                                     f"{len(found)}", param_hint="DIR")
        config_path = found[0]
    config = load_config_arg(config_path, "--config")
    if max_tokens > config.limits.max_tokens:  # the server would refuse every prompt (an int32 past 2^31)
        raise click.BadParameter(f"must be in [1, {config.limits.max_tokens}] (limits.max_tokens of "
                                 f"{config_path}), got {max_tokens}", param_hint="--max-tokens")
    prompts = load_prompts_arg(prompts_path, chat=False) if prompts_path else list(DEFAULT_PROMPTS)
    model_name = model_name or config.name
    configure_threads(config)
    server = None
    if url is None:
        server = TritonServer(model_repository(build_dir), ports=Ports.free()).start()
        url = server.grpc_url
    try:
        cert = certify(url, model_name, config, prompts, max_tokens=max_tokens, samples=samples,
                       api_key=api_key)
    finally:
        if server is not None:
            server.stop()
    for line in cert.lines():
        click.echo(line)
    if not cert.passed:
        raise SystemExit(1)



@main.command()
@click.option("--url", required=True, help="The deployment to check: openai://HOST:PORT (trtspec serve, "
              "trtllm-serve, vLLM, SGLang).")
@click.option("--reference-url", required=True, help="The same model without speculation (trtspec's target "
              "alone, trtllm-serve without a speculative_config): openai://HOST:PORT.")
@click.option("--model", "model_name", default="trtspec", show_default=True,
              help="The model name --url answers to.")
@click.option("--reference-model", default=None,
              help="The name --reference-url answers to (default --model's).")
@click.option("--requests", "count", default=200, show_default=True, type=int, help="Requests sent to each.")
@click.option("--max-tokens", default=64, show_default=True, type=int, help="Most tokens a request asks for.")
@click.option("--prompts", "prompts_path", default=None, type=EXISTING_FILE,
              help="JSONL with a `prompt` per line, or text with one prompt per line (default: the shipped "
                   "held-out code, math and chat prompts).")
@click.option("--temperature", default=0.0, show_default=True, type=float,
              help="0: greedy; above: seeded samples, alike only where the deployments couple them "
                   "(trtspec's sampling.coupling gumbel).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random requests.")
@click.option("--concurrency", default=4, show_default=True, type=int, help="Requests in flight.")
@click.option("--tie-tolerance", default=0.0, show_default=True, type=float,
              help="Nats: a greedy answer (no penalties) that parts where the served token trails the "
                   "token the reference chose, its likeliest, by at most this much parted at a near tie and "
                   "passes (GPU bfloat16 deployments: try 0.05); 0 = identity.")
@click.option("--no-chat", is_flag=True, help="/v1/completions only (a model without a chat template).")
@click.option("--api-key", envvar="OPENAI_API_KEY", default=None,
              help="--url's bearer token (env OPENAI_API_KEY).")
@click.option("--reference-api-key", default=None,
              help="--reference-url's bearer token (none by default: --api-key's goes to --url only).")
@run_errors
def compare(url, reference_url, model_name, reference_model, count, max_tokens, prompts_path, temperature,
            seed, concurrency, tie_tolerance, no_chat, api_key, reference_api_key) -> None:
    """Check a deployment against the same model without speculation, over the OpenAI API: the same
    seeded random requests (completions and chat, stop sequences, penalties, n = 2, streamed or not)
    to both, every answer compared (text, finish reason, token count); exits 1 when any differs.
    The reference is a server on the deployment's own hardware (`verify`'s runs here)."""
    from tqdm import tqdm

    from trtspec.openai.compare import DIFFERENT, asks, compare_deployments
    from trtspec.prompts import TASKS, load_prompts

    for value, hint in ((url, "--url"), (reference_url, "--reference-url")):
        if not _url_arg(value, hint).startswith("openai://"):
            raise click.BadParameter(f"expected openai://HOST:PORT, got {value!r}", param_hint=hint)
    check_range(count, "--requests", low=1)
    check_range(max_tokens, "--max-tokens", low=1, high=2**31 - 1)
    check_range(temperature, "--temperature", low=0, high=2)
    check_range(concurrency, "--concurrency", low=1, high=256)
    check_range(tie_tolerance, "--tie-tolerance", low=0)
    prompts = load_prompts_arg(prompts_path, chat=False) if prompts_path else \
        [p for task in TASKS for p in load_prompts(task)[:8]]
    requests = asks(prompts, count, max_tokens, model_name, seed, temperature, chat=not no_chat)
    with tqdm(total=count, desc="compare", unit="request") as bar:
        result = compare_deployments(url, reference_url, requests, concurrency, tie_tolerance, api_key,
                                     reference_api_key, reference_model, progress=bar.update)
    for line in result.report():
        click.echo(line)
    click.echo("PASS: every answer the reference's" if result.passed else
               "FAIL: answers differ" if result.count(DIFFERENT) else "FAIL: no request was answered")
    if not result.passed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
