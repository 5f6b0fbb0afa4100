"""The OpenAI-compatible app: its routes, an API per module in `trtspec/openai/routes/`
(`/v1/completions` and `/v1/chat/completions`, `/v1/responses`, `/v1/conversations`, Anthropic's
`/v1/messages`, vLLM's tokenizer routes), over the path they share (`frontend`); here `/v1/models`
(and `/v1/models/{model}`), `/health`, `/metrics`, the error handlers and the middleware. Web pages
of the allowed origins may call them from a browser (`cors`).
Every error, a missing route's too, is in OpenAI's shape (Anthropic's on its routes).

Each request is checked (`protocol`), its prompt built (chat template) and counted, then sent to
the Triton model over one gRPC stream (`triton_stream`). Speculative figures ride in a `trtspec`
field: `accepted_tokens`, `draft_tokens`, `target_forwards`.
Log-probabilities (`logprobs`) come with the text they belong to, a step's tokens per chunk.
With a reasoning parser (`reasoning`), a chat answer's reasoning block comes as `reasoning_content`.
A client that disconnects ends its Triton request. With an API key, every `/v1` route needs
`Authorization: Bearer KEY` and answers 401 before anything runs.
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.routing import Match

from trtspec.openai.anthropic_messages import error_body
from trtspec.openai.conversations import ConversationStore
from trtspec.openai.cors import allow_origins
from trtspec.openai.frontend import Frontend
from trtspec.openai.metrics import FrontendMetrics
from trtspec.openai.middleware import PARAM, Authorize, CountAnswers, NoTrailingSlash
from trtspec.openai.model_info import ServedModel
from trtspec.openai.protocol import ApiError
from trtspec.openai.routes import completions, conversations, messages, responses, tokenizer
from trtspec.openai.streams import ClientGone
from trtspec.openai.triton_stream import TritonStream

TOKENIZER_ROUTES = ("/tokenize", "/detokenize", "/tokenizer_info")  # vLLM's; behind the key like /v1
ANTHROPIC_ROUTES = ("/v1/messages",)  # errors in Anthropic's shape



def _route_of(app: FastAPI, scope: dict) -> str:
    """A request's route as its template (`/v1/responses/{rid}`), `other` for none."""
    for route in app.router.routes:
        if route.matches(scope)[0] is Match.FULL:
            return route.path
    return "other"


def _error(exc: ApiError, headers: dict | None = None, path: str = "") -> JSONResponse:
    """`exc` in OpenAI's shape, or on Anthropic's routes (/v1/messages) in Anthropic's."""
    body = error_body(exc) if path.startswith(ANTHROPIC_ROUTES) else exc.body()
    if exc.retry_after_s is not None:
        headers = {**(headers or {}), "Retry-After": str(exc.retry_after_s)}
    return JSONResponse(body, status_code=exc.status, headers=headers)


def create_app(model: ServedModel, triton: TritonStream, api_key: str | None = None,
               allowed_origins: tuple[str, ...] = ()) -> FastAPI:
    """The API of `model` served over `triton`; `api_key`: the key every /v1 route asks for;
    `allowed_origins`: the web pages whose scripts may call it from a browser (cors.py)."""
    app = FastAPI(title="trtspec OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    front = Frontend(model, triton)

    metrics = FrontendMetrics()

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        setattr(request.state, PARAM, exc.param)  # read by CountAnswers
        return _error(exc, path=request.url.path)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone):
        """Nobody reads it: an answer instead of an 'Exception in ASGI application' in the log
        (499, nginx's 'client closed request')."""
        return Response(status_code=499)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        """Starlette's own answers (no such route, a method the route does not take) in OpenAI's shape."""
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            message = f"Invalid URL ({where}): no such route."
        elif exc.status_code == 405:
            message = f"Invalid method ({where}): the route takes {(exc.headers or {}).get('Allow')}."
        else:
            message = f"{exc.detail} ({where})"
        return _error(ApiError(message, status=exc.status_code), exc.headers, request.url.path)

    @app.get("/metrics")
    async def frontend_metrics():
        """The frontend's own counters (`trtspec/openai/metrics.py`); the model's are Triton's."""
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/health")
    async def health():
        if await triton.ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "unavailable"}, status_code=503)

    def card(name: str) -> dict:
        return {"id": name, "object": "model", "created": int(app.state.started), "owned_by": "trtspec",
                "max_model_len": model.context_length}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card(name) for name in model.api_names]}

    @app.get("/v1/models/{name:path}")  # a served name may hold a slash (org/model)
    async def retrieve_model(name: str):
        front.check_model(name)
        return card(name)

    app.state.started = time.time()

    completions.add_routes(app, front)
    tokenizer.add_routes(app, front)
    threads = ConversationStore()  # Responses continue them
    responses.add_routes(app, front, threads)
    conversations.add_routes(app, front, threads)
    messages.add_routes(app, front)

    # each added runs before those added earlier (middleware.py)
    app.add_middleware(Authorize, api_key=api_key, guarded=_guarded, refuse=_unauthorized)
    app.add_middleware(CountAnswers, metrics=metrics, route_of=lambda scope: _route_of(app, scope))
    allow_origins(app, allowed_origins)  # a preflight needs no key
    app.add_middleware(NoTrailingSlash)  # the outermost: every route sees the path without one
    return app


def _guarded(path: str) -> bool:
    """Whether a path asks for the API key: the /v1 routes and vLLM's tokenizer routes."""
    return path.startswith("/v1") or path in TOKENIZER_ROUTES


def _unauthorized(message: str, path: str) -> JSONResponse:
    return _error(ApiError(message, status=401, code="invalid_api_key"), path=path)
