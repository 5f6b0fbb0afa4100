"""Training the embedded models (`pretrain`) and the drafters (`dflash`, `dspark`, `eagle3`)."""

from __future__ import annotations

import math

from trtspec.errors import OptionError


def check_loss(loss: float, step: int) -> None:
    """Stop a run whose loss is no longer a number: it has diverged, and its weights are worthless
    (a `--lr 1e12` run was saved as a success, NaN in its training.json)."""
    if not math.isfinite(loss):
        raise OptionError("--lr", f"is too large: training diverged (the loss is {loss} at step {step}), "
                                  "so the run stops without saving this step")
