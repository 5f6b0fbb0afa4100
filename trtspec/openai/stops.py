"""OpenAI's `stop`: generation ends at the first stop sequence, which is not returned.

The first is the one whose last character comes first in the text (of two ending there, the
longer): the text is cut where generation would have stopped had it been written a character at a
time, however the text arrives (in one piece, or a decode step's at a time), so streamed and
whole answers agree. vLLM looks, at each decode step, for the stop sequences in the order given, so
two that overlap in one step's text can cut it elsewhere there.

The model stops generating once its text holds a stop sequence (Triton's `stop_words`); the
text it sent may run past it (a step emits several tokens). While streaming, the tail that could
still be the start of a stop sequence is held back until the next text decides it. With
`min_tokens`, as in vLLM, a stop sequence counts only where it ends past the text of the first
min_tokens tokens (`protected`): one written before is part of the answer. A stop sequence of
`include` (the request's own with vLLM's include_stop_str_in_output; never a chat template's
end of turn) is cut after instead, so it ends the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StopTrimmer:
    stops: list[str] = field(default_factory=list)
    pending: str = ""  # received, not yet sent
    stopped: bool = False
    # characters at the start of the text where no stop sequence may end (the first min_tokens
    # tokens' text); None: those tokens have not all come yet, so none may end anywhere so far
    protected: int | None = 0
    sent: int = 0  # characters sent before `pending`
    include: frozenset[str] = frozenset()  # stop sequences that stay at the end of the text
    matched: str | None = None  # the stop sequence that ended the text

    def _find(self, stop: str) -> int:
        """Where in `pending` the first occurrence of `stop` that ends past `protected` begins, or -1."""
        if self.protected is None:
            return -1
        return self.pending.find(stop, max(0, self.protected - self.sent - len(stop) + 1))

    def _held(self) -> int:
        """Length of the longest tail of `pending` that begins some stop sequence."""
        for n in range(min(len(self.pending), max(map(len, self.stops)) - 1), 0, -1):
            tail = self.pending[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def push(self, text: str, final: bool = False) -> str:
        """Take new text; return what can be sent now (everything once `final`)."""
        if self.stopped:
            return ""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out
        hits = [(i + len(s), i, s) for s in self.stops if (i := self._find(s)) >= 0]
        if hits:
            self.stopped = True
            end, start, stop = min(hits)
            self.matched = stop
            out, self.pending = self.pending[: end if stop in self.include else start], ""
            return out
        keep = 0 if final else self._held()
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(out):]
        self.sent += len(out)
        return out
