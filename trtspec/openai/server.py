"""Run the OpenAI-compatible frontend (uvicorn) in a thread beside a running Triton server."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import uvicorn

from trtspec.errors import TrtspecError
from trtspec.openai.app import create_app
from trtspec.openai.connections import HEAD_TIMEOUT_S, guarded_protocol, raise_file_limit
from trtspec.openai.model_info import ServedModel
from trtspec.openai.triton_stream import TritonStream

log = logging.getLogger(__name__)


class FrontendError(TrtspecError):
    """The frontend could not start (port taken, bad address)."""


# How long `stop()` lets requests in flight finish, as tritonserver's --exit-timeout-secs does; then
# each gets an error (an event ending its stream, or a 503) instead of a cut connection
GRACE_S = 5.0
# what uvicorn itself allows past that before it cancels the handlers still running
CUT_S = 5.0


class OpenAIFrontend:
    """uvicorn serving `create_app` on host:port in a daemon thread; `stop()` ends it."""

    def __init__(self, model: ServedModel, triton_grpc: str, host: str, port: int,
                 api_key: str | None = None, allowed_origins: tuple[str, ...] = (),
                 head_timeout_s: float = HEAD_TIMEOUT_S, max_connections: int | None = None):
        """`head_timeout_s`, `max_connections`: what a connection may hold (`openai/connections.py`;
        None: as many as the file limit, raised to its hard limit, leaves room for)."""
        self.triton = TritonStream(triton_grpc, model.name)
        self.app = create_app(model, self.triton, api_key, allowed_origins)
        self.host, self.port = host, port
        if max_connections is None:
            max_connections = raise_file_limit()
        config = uvicorn.Config(self.app, host=host, port=port, log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=GRACE_S + CUT_S,
                                http=guarded_protocol(head_timeout_s, max_connections))
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="trtspec-openai", daemon=True)
        self._failed: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except SystemExit:  # uvicorn's exit where it cannot start (a port taken), the reason logged
            pass
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._failed = exc

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await self._server.serve()
        finally:
            runs = list(self.app.state.background_runs)  # background responses end with the server
            for run in runs:
                run.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
            await self.triton.close()

    def start(self, timeout_s: float = 30.0) -> OpenAIFrontend:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                why = self._failed or "it exited (is the port taken?)"
                raise FrontendError(f"OpenAI frontend on {self.host}:{self.port} did not start: {why}")
            time.sleep(0.05)
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, grace_s: float = GRACE_S) -> None:
        """Stop listening and close idle connections at once (uvicorn does both); let requests in
        flight finish for up to `grace_s`, then end each with an error saying the server stopped."""
        self._server.should_exit = True
        self._thread.join(timeout=grace_s)
        if self._thread.is_alive() and self._loop is not None:
            why = f"the server is shutting down: this request was cancelled after the {grace_s:g} s it " \
                  "was given to finish"
            try:
                self._loop.call_soon_threadsafe(self.triton.abort, why)
            except RuntimeError:  # the loop closed meanwhile
                pass
        self._thread.join(timeout=CUT_S + 5)
