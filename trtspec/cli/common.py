"""What the commands share: the `trtspec` group, argument types and checks."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import click

from trtspec.cli_errors import (
    PathArg,
)
from trtspec.console import running
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


def url_arg(url: str, hint: str = "--url") -> str:
    from trtspec.triton.client import ClientError, split_url

    try:
        split_url(url)
    except ClientError as exc:
        # the client names the option and the URL itself, click does here (the URL may hold ": ")
        expected = str(exc).rsplit(": ", 1)[-1]
        raise click.BadParameter(f"{expected}, got {url!r}", param_hint=hint) from None
    return url


def tasks_arg(tasks: str, hint: str = "--tasks") -> list[str]:
    from trtspec.prompts import TASKS

    names = [t for t in tasks.split(",") if t]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise click.BadParameter(f"unknown task(s) {unknown or [tasks]}; expected a comma-separated subset "
                                 f"of {', '.join(TASKS)}", param_hint=hint)
    each_once(names, tasks, hint)
    return names


def each_once(values: list, text: str, hint: str) -> None:
    """Refuse a comma-separated option that repeats a value (a repeated task, concurrency, batch or
    layer tap is a typo: it measured or tapped the same thing twice)."""
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise click.BadParameter(f"{', '.join(map(str, repeated))} given twice in {text!r}; each value once",
                                 param_hint=hint)


def int_list(text: str, hint: str, low: int = 1, distinct: bool = True) -> list[int]:
    """A comma-separated list of integers >= low; with `distinct` each value once (`each_once`)."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected integers like 1,2,4,8, got {text!r}", param_hint=hint) from None
    if min(values) < low:
        raise click.BadParameter(f"values must be >= {low}, got {text!r}", param_hint=hint)
    if distinct:
        each_once(values, text, hint)
    return values


def refuse_given(why: str, *names: str) -> None:
    """A usage error naming the first of the current command's options `names` given on the command
    line (defaults and environment variables pass): an option that would be silently ignored."""
    ctx = click.get_current_context()
    given = click.core.ParameterSource.COMMANDLINE
    for param in ctx.command.params:
        if param.name in names and ctx.get_parameter_source(param.name) == given:
            raise click.BadParameter(why, param_hint=param.opts[0])


def seed_note(seed: int | None) -> str:
    """The summary line's seed of a sampled request (drawn when none was given): --seed repeats it."""
    return "" if seed is None else f" seed={seed}"


def flavour_arg(config, flavour: str):
    """`config` as `--flavour` runs it; a config that flavour cannot run is a usage error."""
    from trtspec.config import with_flavour

    try:
        return with_flavour(config, flavour)
    except TrtspecError as exc:
        raise click.BadParameter(f"{flavour}: {exc}", param_hint="--flavour") from None


INTERRUPTED = 128 + signal.SIGINT  # 130: a shell's status for a command stopped by Ctrl-C


class _Commands(click.Group):
    """The command group, stopped by Ctrl-C as a shell reports it: one line and exit 130 (128 +
    SIGINT), where click printed "Aborted!" and exited 1 as for a failure (`serve` stops its
    servers and exits 0 itself). What a command writes is whole or absent before this runs."""

    def invoke(self, ctx: click.Context):
        try:
            with running():
                return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("\nInterrupted (Ctrl-C).", err=True)
            ctx.exit(INTERRUPTED)


def _show_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """`--version`: the installed version and, from a git checkout, the commit it runs (what a bug
    report and a measurement need: `git log REV..` says what changed since)."""
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import PackageNotFoundError, version

    from trtspec.provenance import source_revision

    try:
        installed = version("trtspec")
    except PackageNotFoundError:  # run from a checkout that was never installed (PYTHONPATH)
        installed = "(not installed)"
    revision = source_revision()
    click.echo(f"trtspec {installed}" + (f" (source {revision})" if revision else ""))
    ctx.exit()


@click.group(cls=_Commands)
@click.option("-v", "--verbose", is_flag=True, help="Log progress at INFO level.")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_show_version,
              help="Show trtspec's version (and the commit of a git checkout) and exit.")
def main(verbose: bool) -> None:
    """trtspec: speculative decoding (DFlash, DSpark, EAGLE-3, draft models) for TensorRT and
    Triton Inference Server."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
