"""Which source a measurement came from: the git revision of the trtspec checkout that ran it.

Figures in docs/ are only as current as the code that measured them; a generated report names its
revision so a reader can tell stale figures from current ones (`git log REV..HEAD`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent  # the checkout holding this package


def source_revision(root: Path = SOURCE) -> str | None:
    """`root`'s short commit, with "+changes" when tracked files differ from it; None when `root`
    is not a git checkout (an installed wheel) or git is missing."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    if git("rev-parse", "--show-toplevel") != str(root):  # a checkout of something else around a wheel
        return None
    commit = git("rev-parse", "--short", "HEAD")
    if commit is None:
        return None
    changes = git("status", "--porcelain", "--untracked-files=no")
    return commit + ("+changes" if changes else "")
