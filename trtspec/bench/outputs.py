"""What `trtspec bench --out DIR` writes there, and how a run replaces an earlier one's.

The folder may hold the user's own files (`make bench` writes into docs/bench/), so bench owns
only the names in `OUTPUT_NAMES`. A run writes its files into a hidden folder inside DIR and
renames each over the earlier run's only once all are written; those of `OUTPUT_NAMES` it did not
write this time are removed. An error or Ctrl-C before that leaves the earlier run's files, and a
run never leaves an earlier run's figures beside its own results (a run without --concurrency kept
the interactivity.png of one with it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trtspec.errors import TrtspecError

OUTPUT_NAMES = ("results.json", "results.md", "tau.png", "acceptance_by_position.png",
                "dflash_block_time.png", "interactivity.png")


@contextmanager
def bench_outputs(out_dir: Path) -> Iterator[Path]:
    """Yield an empty folder to write this run's `OUTPUT_NAMES` into; on success they replace the
    earlier run's in `out_dir`."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=".bench-", dir=out_dir))
    except OSError as exc:
        raise TrtspecError(f"--out {out_dir}: cannot write there: {exc.strerror}") from None
    try:
        yield staged
        written = sorted(p.name for p in staged.iterdir())
        for name in written:
            os.replace(staged / name, out_dir / name)
        for name in set(OUTPUT_NAMES) - set(written):
            (out_dir / name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
