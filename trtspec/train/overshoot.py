"""Overshoot correction: teach a byte-level model to end a line's indentation it has overrun.

A byte-level model writes indentation one space at a time. Our 4M-parameter target tracks the
column only roughly: on aligned continuation lines of held-out stdlib files (an argument list
aligned under its `(`) it often writes a space too many, and once past the column it is in a
state the corpus never shows, a line with more leading spaces than any real one, where it keeps
writing spaces. Greedy decoding then degenerates into a run of spaces up to `max_tokens`.

The correction is the DAgger idea applied to data: put the model in the state it drifts into and
show it the way back. In a training window, one line's leading spaces get `k` extra spaces in the
*input*; the labels of the inserted positions are ignored, except the last one, whose label is the
line's real first non-space byte. The model thereby learns "past the column, stop indenting"
without learning that over-indented lines exist (no label ever asks for an extra space), and every
other label in the window is unchanged.
"""

from __future__ import annotations

import math
import random
import re

IGNORE = -100  # cross_entropy's ignore_index
SPACE = ord(" ")
LEADING_SPACES = re.compile(rb"\n( +)(?=\S)")  # an indented line's leading spaces


def overshoot_window(
    window: list[int], seq_len: int, max_extra: int, rng: random.Random, line_share: float = 1.0
) -> tuple[list[int], list[int]] | None:
    """Inputs and labels (`seq_len` each) in which each indented line of `window` (`seq_len + 1`
    bytes), with probability `line_share`, has k extra leading spaces; None if no line was chosen.

    k is log-uniform in [1, max_extra], so far overshoots are as common per octave as near ones.
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
    # the label of position i is byte i+1, ignored where byte i+1 is an inserted space: so the last
    # real space and every inserted one but the last predict nothing, and the last inserted space
    # predicts the line's real first byte
    labels = [IGNORE if inserted[i + 1] else seq[i + 1] for i in range(len(seq) - 1)]
    return seq[:seq_len], labels[:seq_len]
