"""Files written whole or not at all.

A file is written under a temporary name in its own folder and renamed over its destination only
once complete (`os.replace` is atomic within a file system), so an error or Ctrl-C halfway leaves
the previous file, or none, never a torn one that a later run would read as complete (a torn
`checkpoint/state.pt` made the next `trtspec train` a `PytorchStreamReader` traceback).
"""

from __future__ import annotations

import os
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


def write_text(path: Path, text: str) -> None:
    """`path.write_text(text)`, whole or not at all."""
    with replaced(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
