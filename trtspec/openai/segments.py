"""A chat answer's deltas (`app._Run.deltas`: `reasoning_content`, `content`, `tool_calls`) as the
segments the newer APIs answer in: the reasoning, the text and each tool call, one after another.
The Responses API calls them output items (`responses.OutputItems`), Anthropic's Messages API
content blocks (`anthropic_messages.ContentBlocks`); each renders a segment's start, its text as it
grows and its end as its own streaming events, and a whole answer is the segments its stream
built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

REASONING, TEXT, CALL = "reasoning", "text", "call"


@dataclass(slots=True)
class Segment:
    kind: str  # REASONING, TEXT or CALL
    index: int  # its place in the answer
    text: str = ""  # the reasoning, the text, or a call's arguments (JSON text)
    call_id: str | None = None  # a call's: the id chat gives it
    name: str | None = None  # a call's: the function


class Segments:
    """Segments built from a chat answer's deltas as they come (`push`), the last ended by `close`;
    `started`, `extended` and `ended` give each change's events (none here)."""

    def __init__(self):
        self.segments: list[Segment] = []
        self.open: Segment | None = None  # the segment being written

    def push(self, deltas: list[dict]) -> list[dict]:
        """Events for a chat answer's next deltas."""
        events: list[dict] = []
        for delta in deltas:
            if "reasoning_content" in delta:
                events += self._write(REASONING, delta["reasoning_content"])
            if "content" in delta:
                events += self._write(TEXT, delta["content"])
            for call in delta.get("tool_calls", ()):
                if "id" in call:  # a call's first delta: its id and name
                    events += self._start(Segment(CALL, len(self.segments), call_id=call["id"],
                                                  name=call["function"]["name"]))
                events += self._grow(call["function"]["arguments"])
        return events

    def close(self, status: str = "completed") -> list[dict]:
        """Events that end the segment being written; `status`: incomplete where the answer's token
        limit ran out in it."""
        segment, self.open = self.open, None
        return [] if segment is None else self.ended(segment, status)

    def scored(self, logprobs: dict | None) -> None:
        """The log-probabilities (chat's `logprobs` body) of the tokens whose text comes next; an API
        that gives them keeps them for that text (here: none does)."""

    def text_of(self, kind: str) -> str:
        return "".join(segment.text for segment in self.segments if segment.kind == kind)

    def _write(self, kind: str, text: str) -> list[dict]:
        events = [] if self.open is not None and self.open.kind == kind else \
            self._start(Segment(kind, len(self.segments)))
        return events + self._grow(text)

    def _start(self, segment: Segment) -> list[dict]:
        events = self.close()
        self.segments.append(segment)
        self.open = segment
        return events + self.started(segment)

    def _grow(self, text: str) -> list[dict]:
        self.open.text += text
        return self.extended(self.open, text) if text else []

    # -- each API's events

    def started(self, segment: Segment) -> list[dict]:
        return []

    def extended(self, segment: Segment, text: str) -> list[dict]:
        return []

    def ended(self, segment: Segment, status: str) -> list[dict]:
        return []


def named_sse(event: dict) -> bytes:
    """An event as a server-sent event that names its type: `event: TYPE` and its data."""
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()
