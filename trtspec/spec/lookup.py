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
to build: a 100,000-token prompt costs ~0.1 ms a step), then each place found compared further
back, all at once (~20 µs a step for a request of a few hundred tokens on this CPU).

How many copies a step sends (`SpeculativeDecoder._copied`): with a cost model, the rows and the
common length that maximise expected tokens per second (`spec.cost.admit_rows`, as for a drafter's
rows, without drafter time), each row's survival curve that of the copies whose place matched as
many tokens (how often they were accepted so far); the rows left out draft from the drafter, if
any, or decode plainly. Without one, every copy goes.

The pool (`LookupPool`, `lookup.pool_tokens`): the decoder keeps finished requests' tokens, and a
request copies from them where a place there repeats more of its last tokens than its own tokens do
(at least POOL_KEY): answers to similar prompts share phrasing, templates and boilerplate
(TensorRT-LLM's `is_public_pool`, SGLang's shared n-gram cache). Its copies are priced apart (their
own acceptance by match length) and are point masses as any copy. A request copies only from texts
of requests sent with its cache_salt (`Request.cache_salt`). `SpeculativeDecoder.reset` forgets it
with everything else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

ANSWER_ROOM = 1024  # answer tokens the buffer holds before it first grows
SEPARATOR = -1  # between a pool's texts: no token id, so no run crosses it
POOL_KEY = 3  # fewest last tokens a pool place must repeat (LookupPool's index key)
KEY_BITS = 21  # bits per token in a pool key: ids below 2,097,152 (every vocabulary we know)
WIDE = 4096  # places `_narrow` compares all at once (then [places, max_match] booleans)


class LookupPool:
    """Recent finished requests' tokens (prompt, then answer), newest last, for every request to copy
    from beside its own (TensorRT-LLM's `is_public_pool`, SGLang's shared n-gram cache): answers to
    similar prompts repeat each other's phrasing, templates and boilerplate. Holds at most
    `capacity` tokens; the oldest texts go first. A place is copied from when it repeats at least the
    last POOL_KEY tokens, found by one comparison of each position's key (its last POOL_KEY tokens
    packed into an int64) rather than narrowed from every place of the last token."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        # [length]: the texts one after another, each followed by SEPARATOR, which no run matches
        self.tokens = np.zeros(0, dtype=np.int32)
        self.keys = np.zeros(0, dtype=np.int64)  # [length]: `_keys` of the POOL_KEY tokens ending at each
        self.ends = np.zeros(0, dtype=np.int64)  # [texts]: where each text's separator is (ascending)
        self.salts = np.zeros(0, dtype=np.int64)  # [texts]: `_salt_id` of the cache_salt each came with

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, text: Sequence[int], salt: str = "") -> None:
        """Keep a finished request's tokens (its last `capacity` - 1 when longer), dropping the
        oldest texts to make room; only requests with the same `salt` (cache_salt) copy from them."""
        text = np.asarray(text[-(self.capacity - 1):] if self.capacity > 1 else [], dtype=np.int32)
        if not text.size:
            return
        self.ends = np.append(self.ends, len(self.tokens) + len(text))
        self.salts = np.append(self.salts, _salt_id(salt))
        self.tokens = np.concatenate([self.tokens, text, [SEPARATOR]]).astype(np.int32, copy=False)
        self.keys = np.concatenate([self.keys, _keys(text), [-1]])
        over = len(self.tokens) - self.capacity
        if over > 0:  # whole texts go: the first ones whose ends lie within the excess
            cut = int(self.ends[np.searchsorted(self.ends, over - 1)]) + 1
            self.tokens, self.keys = self.tokens[cut:], self.keys[cut:]
            kept = self.ends >= cut
            self.ends, self.salts = self.ends[kept] - cut, self.salts[kept]

    def clear(self) -> None:
        self.tokens, self.keys, self.ends, self.salts = self.tokens[:0], self.keys[:0], self.ends[:0], \
            self.salts[:0]

    def next(self, tail: np.ndarray, max_match: int, n: int, salt: str = "") -> tuple[list[int], int]:
        """Up to n tokens that followed, in a kept text of requests with `salt`, the place repeating
        the most of `tail`'s last tokens (at least POOL_KEY, at most max_match; of several, the one
        followed by the most, then the newest), and how many it repeats (0: none)."""
        if len(tail) < POOL_KEY or max_match < POOL_KEY:
            return [], 0
        places = np.flatnonzero(self.keys == _keys(tail[-POOL_KEY:])[-1]) + 1  # [m]
        places = places[self.salts[np.searchsorted(self.ends, places)] == _salt_id(salt)]  # its salt's texts
        if not places.size:
            return [], 0
        places, matched = _narrow(self.tokens, tail, places, POOL_KEY, max_match)
        text_ends = self.ends[np.searchsorted(self.ends, places)]  # each place's text ends there
        return _copy_after(self.tokens, places, text_ends, n), matched


def _copy_after(tokens: np.ndarray, places: np.ndarray, stops: np.ndarray | int, n: int) -> list[int]:
    """The tokens after the place (of `places`, ascending) followed by the most before its stop
    (`stops`: where each place's text ends), at most n, the newest of those."""
    follow = np.minimum(stops - places, n)  # tokens after each place, as many as wanted
    best = places[follow == follow.max()][-1]
    return tokens[best : best + int(follow.max())].tolist()


def _salt_id(salt: str) -> int:
    """A cache_salt as the pool tags texts with it: 0 for none, else a 64-bit hash of it (two salts
    sharing one is a 2**-64 chance)."""
    if not salt:
        return 0
    return int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8).digest(), "little", signed=True) or 1


def _keys(text: np.ndarray) -> np.ndarray:
    """[len(text)] int64: the POOL_KEY tokens ending at each position, packed 21 bits apiece (token ids
    below 2,097,152); -1 where fewer precede it."""
    text = text.astype(np.int64)
    keys = np.full(len(text), -1, dtype=np.int64)
    if len(text) >= POOL_KEY:
        packed = np.zeros(len(text) - POOL_KEY + 1, dtype=np.int64)
        for j in range(POOL_KEY):
            packed = (packed << KEY_BITS) | text[j : len(text) - POOL_KEY + 1 + j]
        keys[POOL_KEY - 1 :] = packed
    return keys


class PromptLookup:
    """One request's tokens (prompt, then its answer as it grows) and the drafts they suggest."""

    def __init__(self, prompt: Sequence[int], min_match: int, max_match: int, salt: str = ""):
        self.min_match, self.max_match = min_match, max_match
        self.salt = salt  # the request's cache_salt: the pool's texts it may copy from
        # [capacity]: the prompt and room for the answer, doubled when it fills (int32: 4 bytes a token)
        self.tokens = np.zeros(len(prompt) + ANSWER_ROOM, dtype=np.int32)
        self.tokens[: len(prompt)] = prompt
        self.prompt_len = len(prompt)
        self.length = len(prompt)  # tokens held: the prompt and the answer tokens seen so far
        self.match = 0  # how many tokens the last `next` matched (0: none found)
        self.pooled = False  # whether the last `next` copied from the pool rather than the request

    def next(self, answer: Sequence[int], n: int, pool: LookupPool | None = None) -> list[int]:
        """Up to n tokens to draft after the prompt and `answer` (the tokens generated so far): from
        the request's own tokens, or from `pool`'s texts (of requests with its salt) where one
        repeats more of the last tokens."""
        seen = self.length - self.prompt_len
        new = len(answer) - seen
        if new > 0:
            if self.length + new > len(self.tokens):
                self.tokens = np.concatenate([self.tokens, np.zeros(self.length + new, dtype=np.int32)])
            self.tokens[self.length : self.length + new] = answer[seen:]
            self.length += new
        self.match, self.pooled = 0, False
        if n <= 0:
            return []
        tokens, last = self.tokens[: self.length], self.length - 1
        # an earlier place ends before the last token (ends <= last)
        ends, matched = longest_runs(tokens[:last], tokens, self.max_match)
        drafts: list[int] = []
        if matched >= self.min_match:
            drafts, self.match = _copy_after(tokens, ends, self.length, n), matched
        if pool is not None and len(pool) and self.match < self.max_match:
            copied, pool_matched = pool.next(tokens, self.max_match, n, self.salt)
            if copied and pool_matched > self.match and pool_matched >= self.min_match:  # ties: its own
                drafts, self.match, self.pooled = copied, pool_matched, True
        return drafts


def longest_runs(source: np.ndarray, tail: np.ndarray, max_match: int) -> tuple[np.ndarray, int]:
    """The ends of the places in `source` holding the most of `tail`'s last tokens in a row
    (ascending: source[end - m : end] == tail[-m:]), and how many they hold, m (at most max_match,
    at most len(tail); 0 with no place)."""
    if not len(tail) or not len(source):
        return np.zeros(0, dtype=np.int64), 0
    # places ending where the last token occurs: source[end - 1] == tail[-1]
    ends = np.flatnonzero(source == tail[-1]) + 1  # [m]
    return _narrow(source, tail, ends, 1, max_match) if ends.size else (ends, 0)


def _narrow(source: np.ndarray, tail: np.ndarray, ends: np.ndarray, matched: int,
            max_match: int) -> tuple[np.ndarray, int]:
    """`longest_runs` from `ends`, places holding `matched` of tail's last tokens: each place's run
    measured further at once (up to max_match), and those whose run is the longest kept. Over
    WIDE places (a prompt repeating one token) one position at a time first, so the comparison
    stays small."""
    limit = min(max_match, len(tail))
    while ends.size > WIDE and matched < limit:
        back = ends - 1 - matched  # the token before each place's matched run
        ok = back >= 0
        longer = ends[ok][source[back[ok]] == tail[-1 - matched]]
        if not longer.size:
            return ends, matched
        ends, matched = longer, matched + 1
    if matched >= limit or not ends.size:
        return ends, matched
    offsets = np.arange(matched, limit)  # [s]: how far back each further comparison looks
    back = ends[:, None] - 1 - offsets  # [m, s]: the source token compared with tail[-1 - offset]
    ok = back >= 0
    same = ok & (source[np.where(ok, back, 0)] == tail[len(tail) - 1 - offsets])  # [m, s]
    runs = matched + np.where(same.all(axis=1), len(offsets), same.argmin(axis=1))  # [m]
    longest = runs.max()
    return ends[runs == longest], int(longest)
