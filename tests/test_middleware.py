"""The OpenAI frontend's plain-ASGI middleware (`trtspec.openai.middleware`) without a server: the
scope a route is handed. Served (the key's 401s, the answers counted, a slashed path answered), they
are in test_openai."""

from __future__ import annotations

import asyncio

from trtspec.openai.middleware import NoTrailingSlash


def _handed(scope: dict) -> dict:
    """The scope NoTrailingSlash hands the app behind it."""
    seen = []

    async def app(scope, receive, send):
        seen.append(scope)

    asyncio.run(NoTrailingSlash(app)(scope, None, None))
    return seen[0]


def test_a_trailing_slash_is_taken_off_the_path_and_the_raw_path_alike():
    """The raw path keeps its escapes (only its slashes go); a path of slashes alone is the root;
    without raw_path, the path's own bytes; a path without one, the root itself and a websocket's
    path reach the app as they came."""
    def path_of(path: str, raw: bytes | None, kind: str = "http") -> tuple[str, bytes | None]:
        scope = {"type": kind, "path": path, **({"raw_path": raw} if raw is not None else {})}
        handed = _handed(scope)
        return handed["path"], handed.get("raw_path")

    assert path_of("/v1/models/", b"/v1/models/") == ("/v1/models", b"/v1/models")
    assert path_of("/v1/models/a b//", b"/v1/models/a%20b//") == ("/v1/models/a b", b"/v1/models/a%20b")
    assert path_of("//", b"//") == ("/", b"/")
    assert path_of("/v1/models/", None) == ("/v1/models", b"/v1/models")
    for path, kind in [("/v1/models", "http"), ("/", "http"), ("/v1/realtime/", "websocket")]:
        scope = {"type": kind, "path": path, "raw_path": path.encode()}
        assert _handed(scope) is scope, (path, kind)
