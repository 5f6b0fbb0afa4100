"""`trtspec generate`: one prompt, in this process or to a served model."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.cli.common import (
    flavour_arg,
    main,
    refuse_given,
    seed_note,
    url_arg,
)
from trtspec.cli_errors import (
    PathArg,
    check_range,
    load_config_arg,
    options_model,
    run_errors,
    utf8_text,
)


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
        refuse_given("applies to a served model (--url), not to --config", "model_name", "wait_s", "api_key",
                      "cache_salt")
        config = load_config_arg(config_path, "--config")
        if flavour is not None:
            config = flavour_arg(config, flavour)
        if max_tokens > config.limits.max_tokens:
            raise click.BadParameter(f"must be in [1, {config.limits.max_tokens}] (limits.max_tokens of "
                                     f"{config_path}), got {max_tokens}", param_hint="--max-tokens")
    from trtspec.spec.sampling import SamplingParams

    sampling = options_model(SamplingParams, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                             seed=seed, presence_penalty=presence_penalty,
                             frequency_penalty=frequency_penalty, repetition_penalty=repetition_penalty)
    guide = _guide_args(guide_type, guide)
    if config is None:
        url_arg(url)
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
            f"decode={result.decode_tokens_per_s:.1f} tok/s" + seed_note(result.seed),
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
        + seed_note(completion.seed),
        err=True,
    )
