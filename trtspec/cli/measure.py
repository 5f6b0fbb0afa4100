"""`trtspec bench` and `trtspec profile`: speed side by side, and the machine's cost curves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from trtspec.cli.common import (
    EXISTING_FILE,
    int_list,
    main,
    refuse_given,
    tasks_arg,
    url_arg,
)
from trtspec.cli_errors import (
    PathArg,
    check_range,
    load_config_arg,
    options_model,
    run_errors,
    writable_arg,
)
from trtspec.errors import TrtspecError


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

    levels = int_list(concurrency, "--concurrency") if concurrency else []
    task_names = tasks_arg(tasks)
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

        url_arg(url)
        refuse_given("applies to drafters run here (CONFIGS), not to --url", "repeats", "no_hf", "doc_path",
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
    refuse_given("applies to a served model (--url), not to CONFIGS", "model_name", "warmup", "chat",
                  "salt_per_level", "api_key")
    if not levels:
        refuse_given("applies to the concurrent runs: give --concurrency too", "sps_path", "min_user_tps",
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


def _tree_option(text: str):
    """`--tree N,K` as a TreeConfig, or a usage error naming the option."""
    from pydantic import ValidationError

    from trtspec.config import TreeConfig

    values = int_list(text, "--tree", distinct=False)
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
        refuse_given("applies to CONFIG's cost table, not to --synthetic (its shapes are --batch-sizes, "
                      "--contexts, --new-tokens)", "batches", "requests", "context")
        _profile_synthetic(synthetic_model, out_path, device, scale, reps, batch_sizes, contexts, new_tokens,
                           budget_s)
        return
    if config_path is None:
        raise click.UsageError("missing CONFIG (or --synthetic MODEL)")
    refuse_given("applies with --synthetic MODEL, not to CONFIG", "device", "scale", "batch_sizes",
                  "contexts", "new_tokens", "budget_s")
    from trtspec.bench.profile import DEFAULT_BATCHES, profile_cost
    from trtspec.pipeline import load_pipeline
    from trtspec.runtime import configure_threads

    config = load_config_arg(config_path, "CONFIG")
    sizes = int_list(batches, "--batches") if batches else None
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
            overrides[name] = int_list(text, hint)
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
