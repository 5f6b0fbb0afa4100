"""`python -m trtspec.cli`, as the `trtspec` command (`python -m trtspec` holds Ctrl-C back from
the CLI's own imports too: this one has imported them before it runs)."""

from trtspec.console import main

main()
