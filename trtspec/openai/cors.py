"""Cross-origin requests (CORS): which web pages' scripts may call the API from a browser.

A browser lets a page's script read an answer from another origin (scheme, host and port) only
when the server names the page's origin in `Access-Control-Allow-Origin`, and asks first, with a
preflight `OPTIONS` request, before a request that sends JSON or an `Authorization` header. None is
allowed by default (a server reached by scripts of any page is opt-in); `trtspec serve
--allowed-origin ORIGIN` (repeatable, `*` for any page) answers the preflight before the API key
is asked for (a browser sends no key with it) and marks every answer, errors and streams too.
Credentials (cookies) are never allowed: the API key is a header the page's script sends.
"""

from __future__ import annotations

import re

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

ORIGIN = re.compile(r"(https?)://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])(:\d{1,5})?")


def check_origin(value: str) -> str:
    """`value` as an allowed origin: `*`, or scheme://host[:port] as a browser sends it in `Origin`
    (no path, no trailing slash, a lower-case host); ValueError saying what is wrong otherwise."""
    if value == "*":
        return value
    match = ORIGIN.fullmatch(value)
    if match is None:
        bare = re.match(r"(https?://[^/]+)/", value)
        if bare and ORIGIN.fullmatch(bare.group(1)):
            raise ValueError(f"{value!r} is no origin: an origin has no path (a browser sends "
                             f"{bare.group(1)!r})")
        raise ValueError(f"{value!r} is no origin: expected * or scheme://host[:port] as a browser sends it, "
                         "e.g. http://localhost:5173")
    if match.group(2) != match.group(2).lower():
        raise ValueError(f"{value!r}: browsers send the host in lower case ({value.lower()!r})")
    return value


def allow_origins(app: FastAPI, origins: tuple[str, ...]) -> None:
    """Let pages of `origins` call `app` from a browser (nothing when empty). Added last, it runs
    first: a preflight is answered before the API key is checked, and every answer is marked."""
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(origins), allow_credentials=False,
                           allow_methods=["GET", "POST", "DELETE"], allow_headers=["*"])
