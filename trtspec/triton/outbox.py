"""Responses leave the serving loop through a thread of their own.

A decoupled Python-backend model answers with `sender.send(response, flags)`, and every call
crosses from the backend's stub process to Triton's and waits there: 0.25 ms a response on the
2-core CPU, and building the response's tensors 0.06 ms more. The serving loop streams one
response per running request per step, so at 8 requests it spent about 10 % of each 13-14 ms step
waiting on sends (served tiny-dflash, 8 closed-loop gRPC streams). The `Outbox` takes them off
the loop: the loop queues a response (a function that builds it, called on the outbox's thread)
and steps on while one thread builds and sends in arrival order, overlapping the next step's
forwards (torch lets go of the GIL while it computes).

One thread keeps every request's responses in the order they were queued, so a request's final
response never overtakes its last streamed one. A send that fails (its client went away) calls
the request's `gone` callback, which the loop reads at its next step; a request whose client
cancelled gets only the empty final response Triton still needs. The queue is unbounded: a slow
client delays its own responses, never the loop's steps. `close` sends what is queued and stops.

Its limit: one thread sends about 3,000-4,000 responses a second at these costs. A loop streaming
one response per request per step stays under it while R / step time does (8 requests at 13 ms
steps: 600 a second); a GPU batch of 64 at 20 ms steps would reach it. Fewer responses is the
deployment's choice, `limits.stream_interval` (TensorRT-LLM's): a response every interval-th step
with what the steps between held (`trtspec.triton.model._Stream`). Merging the responses a slow
outbox has queued for one request is not done (no such batch runs here to measure it).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Letter:
    sender: object  # the request's response sender (pb_utils.InferenceResponseSender)
    build: Callable[[], object] | None  # -> the response; None: flags alone
    flags: int
    final: bool  # flags hold TRITONSERVER_RESPONSE_COMPLETE_FINAL: Triton is asked first whether the
    # client cancelled (then only the flag is owed)
    gone: Callable[[], None] | None  # called when the send fails


_STOP = object()


class Outbox:
    """One thread that builds and sends responses in the order they are queued."""

    def __init__(self, final_flag: int, name: str = "trtspec-send"):
        self.final_flag = final_flag
        self._letters: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._deliver, name=name, daemon=True)
        self._thread.start()

    def send(self, sender, build: Callable[[], object] | None, flags: int = 0,
             gone: Callable[[], None] | None = None, at_once: bool = False) -> None:
        """Queue a response: `build()` makes it on the outbox's thread (None: flags alone). A final
        one asks Triton first whether the client cancelled (then it goes without its response); a
        streamed one goes unasked (the loop asks every CANCEL_POLL_S, each question a crossing).
        `at_once`: build and send it on the caller's thread now, for a request with nothing queued
        (its first response: the time to it is the client's time to first token, and waiting for
        the outbox's thread to get the GIL added 1-2 ms to it at one request)."""
        letter = _Letter(sender, build, flags, bool(flags & self.final_flag), gone)
        if at_once:
            self._post(letter)
        else:
            self._letters.put(letter)

    def close(self, timeout: float = 10.0) -> None:
        """Send everything queued, then stop the thread."""
        self._letters.put(_STOP)
        self._thread.join(timeout)

    def _deliver(self) -> None:
        while (letter := self._letters.get()) is not _STOP:
            self._post(letter)

    @staticmethod
    def _post(letter: _Letter) -> None:
        try:
            if letter.final and letter.sender.is_cancelled():  # gone: only the final flag is owed
                letter.sender.send(flags=letter.flags)
                return
            response = None if letter.build is None else letter.build()
            letter.sender.send(response, flags=letter.flags)
        except Exception as exc:  # noqa: BLE001 - a dropped client must not stop the others' responses
            log.warning("could not send a response: %s", exc)
            if letter.gone is not None:
                letter.gone()
