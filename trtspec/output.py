"""The output folder of `trtspec build` belongs to it, whole.

A build is written into a fresh folder beside its destination, marked with `MARKER`, and swapped
in place of the destination only once complete: an error never leaves a half-written folder, and
a rebuild never keeps stale models from an earlier build (a Triton repository that still holds a
model the new build did not write would be served, or fail to load, next to it). A destination
that is not empty and was not written by `trtspec build` is refused, never deleted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trtspec.errors import TrtspecError
from trtspec.files import share

MARKER = ".trtspec-build"
MARKER_TEXT = ("Written by `trtspec build`. The next build into this folder replaces all of it; "
               "keep your own files elsewhere.\n")
LEGACY_MARKERS = ("manifest.json",)  # engine exports from before MARKER existed


class OutputError(TrtspecError):
    """The output folder cannot be written or is not ours to replace."""


def is_build_folder(path: Path) -> bool:
    return any((path / name).is_file() for name in (MARKER, *LEGACY_MARKERS))


def check_replaceable(out_dir: Path, label: str = "--out") -> None:
    """Refuse a destination that is a file, or a non-empty folder `trtspec build` did not write."""
    if out_dir.is_file() or (out_dir.exists() and not out_dir.is_dir()):
        raise OutputError(f"{label} {out_dir} is a file; give a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not is_build_folder(out_dir):
        raise OutputError(f"{label} {out_dir} is not empty and was not written by `trtspec build` "
                          f"(no {MARKER} in it); give a new or empty folder")


def _replace(staged: Path, out_dir: Path, label: str) -> None:
    check_replaceable(out_dir, label)
    if not out_dir.exists():
        staged.rename(out_dir)
        return
    old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
    try:
        out_dir.rename(old)
    except OSError:  # a mount point (a volume) cannot be renamed: replace what is inside it instead
        for child in out_dir.iterdir():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        for child in staged.iterdir():
            shutil.move(str(child), str(out_dir / child.name))
        return
    staged.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_output(out_dir: Path, label: str = "--out") -> Iterator[Path]:
    """Yield an empty folder beside `out_dir`; on success mark it and put it in `out_dir`'s place."""
    out_dir = Path(out_dir)
    check_replaceable(out_dir, label)  # before the work, which may take minutes
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{label} {out_dir}: cannot create {exc.filename}: {exc.strerror}") from None
    try:
        staged = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    except OSError as exc:  # its message names the temporary folder, which the user never chose
        raise OutputError(f"{label} {out_dir}: cannot write in {out_dir.parent}: {exc.strerror}") from None
    share(staged, 0o777)  # mkdtemp makes it 0700; the folder is meant to be shared
    try:
        yield staged
        (staged / MARKER).write_text(MARKER_TEXT, encoding="utf-8")
        _replace(staged, out_dir, label)
    finally:
        if staged.exists():
            shutil.rmtree(staged, ignore_errors=True)


def moved(paths: list[Path], staged: Path, out_dir: Path) -> list[Path]:
    """Paths written under `staged`, as they are named once it became `out_dir`."""
    return [Path(out_dir) / Path(p).relative_to(staged) for p in paths]
