"""Predicted outputs: drafts taken from a text the client expects the answer to repeat.

OpenAI's `prediction: {"type": "content", "content": ...}` sends what most of the answer will be
(a file being rewritten with a few edits). To a speculative decoder that is a draft source needing
no drafter: after the tokens generated so far, the prediction's next tokens are proposed and the
target verifies them as it verifies any draft. Each draft is a point mass, q(x) = 1: greedy rows
accept it where it is the target's argmax, rejection-sampled rows with probability p(x) (on a
rejection the token comes from p with x removed, renormalised), Gumbel-coupled rows where it is the
coupled choice; so the output is the target's, whatever the prediction says.

Where to continue: `PredictedDrafts.next` keeps its place in the prediction (`at`, the position
after the last token it matched). While the answer follows the prediction the place moves with
it; once the answer leaves it (an edit), the place is found again, token by token, where the
prediction holds the longest run of the answer's last tokens (at least 2: one byte or token alone
matches anywhere; a short run of a byte-level model's common letters matches in many places, a
long one in the right place), so drafting resumes where the answer comes back to the predicted
text; until it does, the request drafts as any other.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

MATCH = 32  # the longest run of the answer's last tokens compared when finding its place again
PREDICTION_DRAFTS = 16  # drafts a step takes from a prediction at most


class PredictedDrafts:
    """A request's prediction (token ids) and its place in it."""

    def __init__(self, tokens: Sequence[int]):
        self.tokens = tuple(tokens)
        self.at = 0  # prediction[:at] stands for the answer so far (where it followed the prediction)
        self.lost = False  # the answer left the prediction and has not come back to it yet
        self.seen = 0  # answer tokens already followed

    @functools.cached_property
    def ends(self) -> dict[tuple[int, ...], list[int]]:
        """Where each pair of tokens ends in the prediction, built when the answer first leaves it
        (3 ms for 20,000 tokens, on the serving loop's thread: an answer that follows its prediction
        never pays it)."""
        ends: dict[tuple[int, ...], list[int]] = {}
        for end in range(2, len(self.tokens) + 1):
            ends.setdefault(self.tokens[end - 2 : end], []).append(end)
        return ends

    def next(self, answer: Sequence[int], n: int) -> list[int]:
        """Up to n tokens to draft after `answer` (the tokens generated so far)."""
        self._follow(answer)
        return [] if self.lost or n <= 0 else list(self.tokens[self.at : self.at + n])

    def _follow(self, answer: Sequence[int]) -> None:
        for i in range(self.seen, len(answer)):
            if not self.lost and self.at < len(self.tokens) and self.tokens[self.at] == answer[i]:
                self.at += 1
                continue
            found = self._find(answer, i + 1)
            self.lost = found is None
            if found is not None:
                self.at = found
        self.seen = len(answer)

    def _find(self, answer: Sequence[int], upto: int) -> int | None:
        """Where answer[:upto] ends in the prediction: the end of the longest run of its last tokens
        (at least 2, at most MATCH) the prediction holds; of equally long ones, the first at or after
        the current place, else the last before it. None: the prediction does not hold its last 2."""
        if upto < 2:
            return None
        best, best_key = None, None
        for end in self.ends.get((answer[upto - 2], answer[upto - 1]), ()):
            n = 2
            while n < MATCH and n < end and n < upto and self.tokens[end - 1 - n] == answer[upto - 1 - n]:
                n += 1
            key = (n, end >= self.at, -end if end >= self.at else end)
            if best_key is None or key > best_key:
                best, best_key = end, key
        return best
