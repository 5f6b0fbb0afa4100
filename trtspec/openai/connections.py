"""What the OpenAI frontend lets a TCP connection hold: a time to send a request's head, and a cap on
open connections below the process's file limit.

uvicorn times out a keep-alive connection only after a response: a connection that sends nothing,
or half a request head, stays open for good. Found stressing the server (2026-12-06): 20,500 such
connections (no key needed, no byte sent) took the serve process's 20,000 file descriptors; every
request and /health then timed out, and asyncio logged "socket.accept() out of system resource"
about 5,000 times a second (127 MB in a minute: its accept loop logs each of its 2,048 tries). As
nginx's `client_header_timeout` (60 s) and Node's `headersTimeout`, a connection whose request head
is not whole `head_timeout_s` after it opened (or after its last response) is closed; connections
past `max_connections` are closed as they come, so the descriptors never run out. Both apply to
uvicorn's h11 protocol, which trtspec runs whatever else is installed.
"""

from __future__ import annotations

import asyncio
import resource

from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 60.0  # nginx's client_header_timeout
SPARE_FILES = 256  # descriptors kept for what the process opens besides connections


def raise_file_limit() -> int:
    """Raise the process's soft limit on open files to its hard limit (as vLLM's set_ulimit does) and
    return the connections the frontend may hold under it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # not allowed here: the soft limit stands
            pass
    return max(16, soft - SPARE_FILES)


def guarded_protocol(head_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a time limit on request heads and a cap on open connections."""

    class Guarded(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_timer: asyncio.TimerHandle | None = None
            if len(self.connections) > max_connections:  # over the cap: closed as it comes
                transport.close()
                return
            self._await_head()

        def _await_head(self) -> None:
            """Wait `head_timeout_s` for the next request's head (a new cycle) to come whole."""
            self._head_cycle = self.cycle
            self._head_timer = self.loop.call_later(head_timeout_s, self._head_late)

        def _head_late(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_timer is not None and self.cycle is not self._head_cycle:  # a head came whole
                self._head_timer.cancel()
                self._head_timer = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._head_timer is None and not self.transport.is_closing():  # kept alive: the next head
                self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

    return Guarded
