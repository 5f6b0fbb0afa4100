"""What every request of the OpenAI frontend passes through before its route: plain ASGI.

Starlette's `@app.middleware("http")` (BaseHTTPMiddleware) hands a streamed answer from the route
to the client through a memory stream and a task of its own, chunk by chunk, and re-wraps the
request's `receive` to watch for a disconnect: with two of them that was about half of what the
frontend's event loop spent per streamed token (py-spy, 8 streaming chat clients). These three
are plain ASGI callables instead, which pass `receive` and `send` through, touching only what they
need: the path, the headers of an unauthorized request, the status of the answer.

- `NoTrailingSlash` (outermost): `/v1/chat/completions/` is served as `/v1/chat/completions`.
- `CountAnswers`: every answer counted by its route template and status, a refusal by the
  parameter it names (`FrontendMetrics`; outside `Authorize`, so the key's 401s are counted too).
- `Authorize`: the /v1 routes and vLLM's tokenizer routes ask for the API key.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trtspec.openai.metrics import FrontendMetrics

PARAM = "param"  # where an error's handler leaves the parameter it names: scope["state"][PARAM]


class NoTrailingSlash:
    """Serve a path with a trailing slash (`/v1/chat/completions/`) as the path without it, where
    Starlette would answer a 307 redirect to it: one a client re-sending its body may not follow,
    and that names the URL the server saw (http:// behind a proxy ending TLS)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            raw = scope.get("raw_path") or path.encode()
            scope = {**scope, "path": path.rstrip("/") or "/", "raw_path": raw.rstrip(b"/") or b"/"}
        await self.app(scope, receive, send)


class CountAnswers:
    """Count every answer as it starts: its route (`route_of(scope)`), status, and the parameter
    an error named (`scope["state"][PARAM]`, set by the error's handler before it answers)."""

    def __init__(self, app: ASGIApp, metrics: FrontendMetrics, route_of: Callable[[Scope], str]):
        self.app, self.metrics, self.route_of = app, metrics, route_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})  # the dict a route's `request.state` writes to

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.observe(self.route_of(scope), message["status"], state.get(PARAM))
            await send(message)

        await self.app(scope, receive, counted)


class Authorize:
    """Ask `guarded` paths for `Authorization: Bearer KEY` (Anthropic's clients send `x-api-key:
    KEY`); `refuse(message, path)` makes the 401, in the shape the path's API answers errors in."""

    def __init__(self, app: ASGIApp, api_key: str | None, guarded: Callable[[str], bool],
                 refuse: Callable[[str, str], Response]):
        self.app, self.api_key, self.guarded, self.refuse = app, api_key, guarded, refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.api_key and scope["type"] == "http" and self.guarded(scope["path"]):
            headers = Headers(scope=scope)
            given = headers.get("authorization", "")
            if not given and "x-api-key" in headers:
                given = f"Bearer {headers['x-api-key']}"
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                message = "Incorrect API key provided." if given else \
                    "You didn't provide an API key: send `Authorization: Bearer KEY` (Anthropic's clients: " \
                    "`x-api-key: KEY`)."
                await self.refuse(message, scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)
