"""Test support: with this folder on PYTHONPATH, Python imports like the GPU image (trtspec.gpu.image).

Python imports `sitecustomize` at start-up, so the guard is in place before any project code runs,
also in a process started by scripts/gpu_check.sh. Environment (all optional):
TRTSPEC_IMAGE_WHEELS (a wheels.txt to use instead of trtspec/gpu/wheels.txt),
TRTSPEC_IMAGE_FIRST_PARTY (extra comma-separated top-level modules whose imports are checked),
TRTSPEC_IMAGE_GUARD_LOG (a file each refused import is appended to, as "module importer").
"""

import os
from pathlib import Path

from trtspec.gpu.image import CARRIED_WHEELS, FIRST_PARTY, install_guard

_extra = tuple(m for m in os.environ.get("TRTSPEC_IMAGE_FIRST_PARTY", "").split(",") if m)
_log = os.environ.get("TRTSPEC_IMAGE_GUARD_LOG")
install_guard(wheels=Path(os.environ.get("TRTSPEC_IMAGE_WHEELS", CARRIED_WHEELS)),
              first_party=FIRST_PARTY + _extra, log_path=Path(_log) if _log else None)
