"""`python -m trtspec`, as the `trtspec` command."""

from trtspec.console import main

main()
