"""OpenAI's `logprobs` bodies, from the served model's generated ids and their log-probabilities.

The values are the target's raw log p (`trtspec.spec.logprobs`). Each token is named by its id
decoded alone, special tokens shown, as vLLM names them (`tokenizer.token_bytes`); a piece of a
multi-byte character is U+FFFD there. Chat's `bytes` are the bytes the id stands for
(`tokenizer.raw_bytes`), a piece of a character's too, so a client that joins them rebuilds the
text, as OpenAI's do (vLLM sends the name's UTF-8, U+FFFD's for a piece): exact for the byte-level
models, byte-level BPE and byte-fallback SentencePiece tokenizers; others' are the name's. -inf is
sent as -9999.0, as vLLM does: JSON has no infinity.

`text_offset` is where a token's text begins in the choice's text (with echo, the prompt's text
first): the characters the ids before it produced, decoded as the answer is (`TextStream`: an
incomplete character counts once complete, a special token or an end id adds nothing), so
`text[text_offset[i]:]` starts with token i's text (a piece of a character: where the
character begins). vLLM adds up the lengths of the tokens' names, which drift from the text at
every piece of a character, special token (echo's BOS) or SentencePiece space.

    completions: {"tokens": [str], "token_logprobs": [float], "top_logprobs": [{str: float}],
                  "text_offset": [int]}      each top dict holds the chosen token and the k best;
                  with echo the prompt's tokens come first, its first with null log p and top
    chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from trtspec.triton.request import TextStream, context_of

FLOOR = -9999.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else FLOOR


@dataclass(slots=True)
class LogprobsBody:
    """Builds the `logprobs` of a choice, a step's tokens at a time (streamed) or all at once."""

    tokenizer: object  # trtspec.tokenizer.TextTokenizer
    chat: bool
    # echo: the prompt's (ids, characters), which come first; the completion's text starts after them
    prompt: tuple[int, int] | None = None
    lead: int = 0  # echo: the prompt's characters before its ids' text (a space SentencePiece strips)
    context: tuple[int, ...] = ()  # the prompt's last ids the completion's text is decoded after
    counted: int = 0  # ids whose text_offset was given
    base: int = 0  # where the text of the ids `written` counts begins
    written: TextStream | None = field(default=None, repr=False)  # their text, as the answer decodes it

    def follow(self, prompt_ids: list[int], echo: str | None) -> None:
        """Count the offsets of a completion of `prompt_ids`, decoded after the prompt's last ids as
        its text is; with `echo` (the prompt's text, which the choice's text starts with), the
        prompt's ids first, their text where it ends `echo` (a prompt's text decodes to itself but
        where the tokenizer strips a space or leaves out a special token's text)."""
        self.context = context_of(self.tokenizer.decode, prompt_ids)
        if echo is not None:
            self.prompt = (len(prompt_ids), len(echo))
            own = self.tokenizer.decode(list(prompt_ids))
            self.lead = len(echo) - len(own) if echo.endswith(own) else 0

    def _offset(self, token_id: int) -> int:
        """Where `token_id`'s text begins in the choice's text (completions' text_offset)."""
        if self.written is None or (self.prompt is not None and self.counted == self.prompt[0]):
            if self.prompt is not None and self.counted < self.prompt[0]:  # echo: the prompt's ids
                self.base, self.written = self.lead, TextStream(self.tokenizer.decode)
            else:  # the completion's, after the prompt's text
                self.base = 0 if self.prompt is None else self.prompt[1]
                self.written = TextStream(self.tokenizer.decode, context=self.context)
        sent, held = self.written.sent, self.written.held
        produced = self.written.push([token_id])[0]
        after = produced or self.written.held  # the held ids' text and this id's
        self.counted += 1
        # what this id left of the held text is theirs (invalid bytes, U+FFFD), not a piece of the
        # character it completes; while still held, the last character may be a piece of one
        settled = len(after) if produced else max(0, len(after) - 1)
        return self.base + sent + min(len(os.path.commonprefix([held, after])), settled)

    def _token(self, token_id: int) -> tuple[str, list[int]]:
        """(name, bytes): the id decoded alone, as vLLM names it, and the bytes it stands for."""
        name = self.tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")
        return name, list(self.tokenizer.raw_bytes(token_id))

    def body(self, ids: list[int], values: list[float | None], top_ids: list[list[int] | None],
             top_values: list[list[float] | None]) -> dict:
        """The logprobs object for `ids` (the next ones of the choice) and their log p (None: a
        prompt's first token, which nothing predicts)."""
        if self.chat:
            content = []
            for token_id, value, alt_ids, alt_values in zip(ids, values, top_ids, top_values, strict=True):
                token, raw = self._token(token_id)
                top = []
                for alt, alt_value in zip(alt_ids, alt_values, strict=True):
                    alt_token, alt_raw = self._token(alt)
                    top.append({"token": alt_token, "logprob": _finite(alt_value), "bytes": alt_raw})
                content.append({"token": token, "logprob": _finite(value), "bytes": raw, "top_logprobs": top})
            return {"content": content}
        tokens, offsets, tops = [], [], []
        for token_id, value, alt_ids, alt_values in zip(ids, values, top_ids, top_values, strict=True):
            token, _ = self._token(token_id)
            tokens.append(token)
            offsets.append(self._offset(token_id))
            if value is None:
                tops.append(None)
                continue
            top = {token: _finite(value)}
            for alt, alt_value in zip(alt_ids, alt_values, strict=True):
                top.setdefault(self._token(alt)[0], _finite(alt_value))
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": [None if v is None else _finite(v) for v in values],
                "top_logprobs": tops, "text_offset": offsets}
