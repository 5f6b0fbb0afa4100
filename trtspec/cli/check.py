"""`trtspec verify` and `trtspec compare`: a served deployment checked against its reference."""

from __future__ import annotations

from pathlib import Path

import click

from trtspec.cli.common import (
    EXISTING_DIR,
    EXISTING_FILE,
    main,
    refuse_given,
    url_arg,
)
from trtspec.cli_errors import (
    PathArg,
    check_range,
    load_config_arg,
    load_prompts_arg,
    run_errors,
)


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
        url_arg(url)
    if url is None or not url.startswith("openai://"):  # Triton's endpoints take no key
        refuse_given("applies to an OpenAI-compatible server (--url openai://…)", "api_key")
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
        if not url_arg(value, hint).startswith("openai://"):
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
