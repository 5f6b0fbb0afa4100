"""Overshoot correction: teach a byte-level model to end a line's indentation it has overrun.

A byte-level model writes indentation one space at a time. Our 4M-parameter target tracks the
column only roughly: on aligned continuation lines of held-out stdlib files (an argument list
aligned under its `(`) it often writes a space too many, and once past the column it is in a
state the corpus never shows, a line with more leading spaces than any real one, where it keeps
writing spaces. Greedy decoding then degenerates into a run of spaces up to `max_tokens`.

The correction is the DAgger idea applied to data: put the model in the state it drifts into and
show it the way back. In a training window, an indented line's leading spaces get `k` extra
spaces in the *input*. With `stop_every` (the shipped recipe) every overshot position, the line's
last real space and each inserted one, is labelled with the line's real first non-space byte: the
expert's action in each state the model drifted into. Without it only the last inserted space is,
and the other overshot positions are ignored; that first version left the model running away on
36 % of aligned lines, since one stop label per overshoot is outweighed by the real spaces of lines
the model cannot tell apart without counting. Either way no label ever asks for an extra space,
and every label outside the overshot positions is unchanged.
"""

from __future__ import annotations

import math
import random
import re

IGNORE = -100  # cross_entropy's ignore_index
SPACE = ord(" ")
LEADING_SPACES = re.compile(rb"\n( +)(?=\S)")  # an indented line's leading spaces


def overshoot_window(
    window: list[int], seq_len: int, max_extra: int, rng: random.Random, line_share: float = 1.0,
    stop_every: bool = False,
) -> tuple[list[int], list[int]] | None:
    """Inputs and labels (`seq_len` each) in which each indented line of `window` (`seq_len + 1`
    bytes), with probability `line_share`, has k extra leading spaces; None if no line was chosen.

    k is log-uniform in [1, max_extra], so far overshoots are as common per octave as near ones.
    `stop_every` labels every overshot position (the line's last real space and each inserted one)
    with the line's real first byte, instead of the last inserted space only.
    """
    ends = [m.end() for m in LEADING_SPACES.finditer(bytes(window)) if m.end() < len(window) - 1]
    chosen = [end for end in ends if rng.random() < line_share]  # first non-space byte of each line
    if not chosen:
        return None
    seq: list[int] = []
    inserted: list[bool] = []
    prev = 0
    for end in chosen:
        k = round(2 ** rng.uniform(0, math.log2(max_extra)))
        seq += window[prev:end] + [SPACE] * k
        inserted += [False] * (end - prev) + [True] * k
        prev = end
    seq += window[prev:]
    inserted += [False] * (len(window) - prev)
    # the label of position i is byte i+1, or where byte i+1 is an inserted space either nothing
    # (the last inserted space alone then predicts the line's real first byte) or, with
    # `stop_every`, that real first byte: the next byte that was not inserted
    labels = [0] * (len(seq) - 1)
    next_real = IGNORE
    for i in range(len(seq) - 2, -1, -1):
        if not inserted[i + 1]:
            next_real = seq[i + 1]
        labels[i] = next_real if stop_every or not inserted[i + 1] else IGNORE
    return seq[:seq_len], labels[:seq_len]
