"""Prompt lookup: drafts copied from the request's own tokens (n-gram speculation).

Answers repeat their context: code edits copy the file they were given, summaries quote their
source, a model in a loop repeats itself. Prompt lookup decoding (Saxena, 2023; vLLM's `ngram`
method, TensorRT-LLM's `NGramDecodingConfig`) drafts with no network at all: find an earlier place
where the request's tokens (prompt + answer so far) end as they end now, and propose the tokens
that followed it there. The target verifies them as any draft; each is a point mass, q(x) = 1 (the
same rule as a predicted output's drafts, `spec.prediction`), so the output is the target's.

Where to copy from (`PromptLookup.next`): the earlier place whose tokens match the most of the
request's last ones (at least `min_match`, at most `max_match`); of those, the one with the most
tokens after it (a short loop, "abcabc", copies a whole period rather than one token), and of
those the newest. Found by one vectorised comparison over the request's tokens per step (no index
to build: a 100,000-token prompt costs ~0.1 ms a step), narrowed one position back at a time.

How many copies a step sends (`SpeculativeDecoder._copied`): with a cost model, the rows and the
common length that maximise expected tokens per second (`spec.cost.admit_rows`, as for a drafter's
rows, without drafter time), each row's survival curve that of the copies whose place matched as
many tokens (how often they were accepted so far); the rows left out draft from the drafter, if
any, or decode plainly. Without one, every copy goes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ANSWER_ROOM = 1024  # answer tokens the buffer holds before it first grows


class PromptLookup:
    """One request's tokens (prompt, then its answer as it grows) and the drafts they suggest."""

    def __init__(self, prompt: Sequence[int], min_match: int, max_match: int):
        self.min_match, self.max_match = min_match, max_match
        # [capacity]: the prompt and room for the answer, doubled when it fills (int32: 4 bytes a token)
        self.tokens = np.zeros(len(prompt) + ANSWER_ROOM, dtype=np.int32)
        self.tokens[: len(prompt)] = prompt
        self.prompt_len = len(prompt)
        self.length = len(prompt)  # tokens held: the prompt and the answer tokens seen so far
        self.match = 0  # how many tokens the last `next` matched (0: none found)

    def next(self, answer: Sequence[int], n: int) -> list[int]:
        """Up to n tokens to draft after the prompt and `answer` (the tokens generated so far)."""
        seen = self.length - self.prompt_len
        new = len(answer) - seen
        if new > 0:
            if self.length + new > len(self.tokens):
                self.tokens = np.concatenate([self.tokens, np.zeros(self.length + new, dtype=np.int32)])
            self.tokens[self.length : self.length + new] = answer[seen:]
            self.length += new
        self.match = 0
        if n <= 0:
            return []
        ends, matched = self._longest_matches()
        if matched < self.min_match:
            return []
        self.match = matched
        follow = np.minimum(self.length - ends, n)  # tokens after each place, as many as wanted
        best = ends[follow == follow.max()][-1]  # the most to copy, then the newest
        return self.tokens[best : best + int(follow.max())].tolist()

    def _longest_matches(self) -> tuple[np.ndarray, int]:
        """The ends of the earlier places holding the most of the last tokens (ascending), and how
        many they hold (at most max_match)."""
        tokens, last = self.tokens[: self.length], self.length - 1
        if last < 1:
            return np.zeros(0, dtype=np.int64), 0
        # places ending where the last token occurs earlier: tokens[end - 1] == tokens[last]
        ends = np.flatnonzero(tokens[:last] == tokens[last]) + 1  # [m]
        matched = 1 if ends.size else 0
        while 0 < matched < self.max_match and matched <= last:
            back = ends - 1 - matched  # the token before each place's matched run
            ok = back >= 0
            longer = ends[ok][tokens[back[ok]] == tokens[last - matched]]
            if not longer.size:
                break
            ends, matched = longer, matched + 1
        return ends, matched
