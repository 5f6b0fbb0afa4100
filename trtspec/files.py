"""Files and folders written whole or not at all.

A file is written under a temporary name in its own folder and renamed over its destination only
once complete (`os.replace` is atomic within a file system), so an error or Ctrl-C halfway leaves
the previous file, or none, never a torn one that a later run would read as complete (a torn
`checkpoint/state.pt` made the next `trtspec train` a `PytorchStreamReader` traceback). A folder
(`replaced_dir`, a model's) is filled beside its destination and swapped in once complete.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replaced(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; once the block has written it, it becomes `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        share(tmp, 0o666)  # mkstemp makes it 0600; a checkpoint is meant to be shared
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def share(path: Path, mode: int) -> None:
    """Give `path` the permissions a plain open or mkdir would have (`mode` less the process's
    umask), where tempfile made it private to its owner."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(mode & ~umask)


NAME_MAX = 255  # bytes in one file or folder name (Linux file systems)
PATH_MAX = 4095  # bytes in a whole path the kernel takes


def too_long(path: str | Path) -> str | None:
    """Why the file system would refuse `path` as "File name too long", in words, or None."""
    raw = os.fsencode(path)
    if len(raw) > PATH_MAX:
        return f"is {len(raw):,} bytes long, over the {PATH_MAX:,} a path may have"
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return f"holds a name of {len(longest):,} bytes, over the {NAME_MAX} a file or folder name may have"
    return None


def write_text(path: Path, text: str) -> None:
    """`path.write_text(text)`, whole or not at all."""
    with replaced(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextmanager
def replaced_dir(path: Path) -> Iterator[Path]:
    """Yield an empty folder beside `path`; once the block has filled it, it takes the place of
    `path`, whose earlier contents are removed only then. An error or Ctrl-C in the block leaves
    `path` as it was and no temporary folder behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        share(tmp, 0o777)  # mkdtemp makes it 0700; a model folder is meant to be shared
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        had = path.exists() or path.is_symlink()
        if had:
            path.rename(old)
        try:
            tmp.rename(path)
        except BaseException:
            if had:
                old.rename(path)
            raise
        if had:
            shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # still there: it never became `path`
