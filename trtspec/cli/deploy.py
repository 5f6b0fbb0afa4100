"""`trtspec inspect`, `build` and `serve`: a build config to a served Triton repository."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.cli.common import (
    PORT,
    flavour_arg,
    main,
)
from trtspec.cli_errors import (
    PathArg,
    load_config_arg,
    run_errors,
    writable_arg,
)


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
        config = flavour_arg(config, flavour)
    try:
        check_replaceable(out_dir)
    except OutputError as exc:
        raise click.BadParameter(str(exc).removeprefix("--out "), param_hint="--out") from None
    writable_arg(out_dir, "--out", folder=True)  # under a file: "cannot create afile: File exists", exit 1
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
