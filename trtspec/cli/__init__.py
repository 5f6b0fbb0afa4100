"""`trtspec` command line: thin commands over the library.

A bad option or argument is a usage error (exit 2, with usage); a failure while running is one
`Error:` line (exit 1); Ctrl-C one line (exit 130). See `trtspec.cli_errors` for which is which.
"""

from trtspec.cli import ask, check, deploy, measure, training  # noqa: F401 - each registers its commands
from trtspec.cli.ask import generate
from trtspec.cli.check import compare, verify
from trtspec.cli.common import main
from trtspec.cli.deploy import build, inspect, serve
from trtspec.cli.measure import bench, profile
from trtspec.cli.training import calibrate, train

__all__ = ["main", "generate", "train", "calibrate", "bench", "profile", "inspect", "build", "serve",
           "verify", "compare"]
