"""`python -m trtspec.cli`, as the `trtspec` command."""

from trtspec.cli import main

main()
