"""How the CLI reports failures: what the user typed vs what went wrong while running.

- Usage errors (exit 2, usage shown): an option or argument that cannot be turned into what the
  command takes — a value out of range, contradictory options, a build config or prompts file
  that is missing or invalid, a URL that is not grpc://HOST:PORT. Commands raise
  `click.BadParameter` / `click.UsageError` for these, naming the option; the library raises
  `OptionError` for a value only a loaded model can judge (a tap layer the target lacks).
- Run-time failures (exit 1, one `Error:` line, no usage): everything after the arguments were
  understood — a checkpoint that will not load, a server that cannot be reached or refuses the
  request, a build that cannot finish, a file that cannot be written. `run_errors` turns the
  library's errors (`TrtspecError`, other `ValueError`s, `OSError`) into `click.ClickException`.
  With `-v` the traceback is logged as well.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from pathlib import Path
from typing import TypeVar

import click
from pydantic import BaseModel, ValidationError

from trtspec.errors import ConfigError, OptionError, TrtspecError
from trtspec.files import too_long

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


def first_line(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return text.splitlines()[0] if text else repr(exc)


class PathArg(click.Path):
    """`click.Path` that also refuses, naming the option, an empty path and one the file system would
    call too long (its own "File name too long" named neither the option nor the limit)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value:  # Path("") is ".": `bench --out "$OUT"` wrote here
            self.fail("an empty path (an unset variable?); give a file or folder", param, ctx)
        if isinstance(value, (str, os.PathLike)) and (why := too_long(value)):
            self.fail(f"the path {why}", param, ctx)
        return super().convert(value, param, ctx)


def run_errors(fn):
    """Library errors raised while a command runs become one `Error:` line and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except click.ClickException:
            raise
        except OptionError as exc:  # found while running, but the option's value is what is wrong
            raise click.BadParameter(exc.why, param_hint=exc.option) from None
        except (TrtspecError, ValueError, OSError) as exc:
            log.info("%s failed", fn.__name__, exc_info=True)  # shown with -v
            raise click.ClickException(first_line(exc)) from None
        except (MemoryError, OverflowError, RuntimeError) as exc:
            # torch's allocator, a C++ size check, an integer past what a library takes: almost always a
            # setting too large for this machine (found fuzzing: --layers 100000, --requests 10^8)
            log.info("%s failed", fn.__name__, exc_info=True)
            raise click.ClickException(f"{first_line(exc)} ({type(exc).__name__}; a setting too large for "
                                       "this machine? -v shows where it failed)") from None

    return wrapper


def load_config_arg(path: Path, hint: str):
    """The build config named on the command line; a missing or invalid file is a usage error
    (every mistake in it listed), like any argument click cannot convert."""
    from trtspec.config import load_build_config

    try:
        return load_build_config(path)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


def load_prompts_arg(path: Path, hint: str = "--prompts", chat: bool = True) -> list:
    """A prompts file given as an option (`chat`: its lines may hold `messages`): missing,
    unreadable or malformed is a usage error."""
    from trtspec.train.prompts import load_prompt_file

    try:
        return load_prompt_file(path, chat)
    except (TrtspecError, OSError) as exc:
        raise click.BadParameter(first_line(exc), param_hint=hint) from None


def utf8_text(value: str, hint: str) -> str:
    """Refuse argv bytes that were not UTF-8 (Python keeps them as lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise click.BadParameter(f"is not valid UTF-8 text (byte {exc.start})", param_hint=hint) from None
    return value


def options_model(cls: type[M], renamed: dict[str, str] | None = None, **values) -> M:
    """Build a pydantic model from option values; a value it refuses names its `--option`
    (`--field-name`, or `renamed[field]` where the option is spelled differently)."""
    try:
        return cls(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else cls.__name__
        option = (renamed or {}).get(field, "--" + field.replace("_", "-"))
        raise click.BadParameter(f"{err['msg']}, got {err.get('input')!r}", param_hint=option) from None


def check_range(value: float, hint: str, low: float | None = None, high: float | None = None) -> None:
    if value != value:  # nan passes every comparison below (--wait nan ran as --wait 0)
        raise click.BadParameter("must be a number, got nan", param_hint=hint)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"<= {high}" if low is None else f"in [{low}, {high}]"
        raise click.BadParameter(f"must be {bounds}, got {value}", param_hint=hint)


def writable_arg(path: Path, hint: str, folder: bool) -> None:
    """Refuse an output path (a folder when `folder`, else a file) that cannot be written: checked
    before a run that may take hours, not after it (`--out FILE/x` failed once everything was
    measured)."""
    kind, other = ("folder", "file") if folder else ("file", "folder")
    if path.exists() and path.is_dir() != folder:
        raise click.BadParameter(f"{path} is a {other}; give a {kind}", param_hint=hint)
    # an existing file is replaced (written whole, beside it): what must be writable is its folder
    existing = path if path.exists() and folder else path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise click.BadParameter(f"{existing} is a file, so {path} cannot be made", param_hint=hint)
    try:  # tried for real: root passes every permission bit, yet /proc, /sys and read-only mounts refuse it
        os.rmdir(tempfile.mkdtemp(prefix=".trtspec-write-check-", dir=existing))
    except OSError as exc:
        raise click.BadParameter(f"cannot write in {existing} ({exc.strerror})", param_hint=hint) from None
