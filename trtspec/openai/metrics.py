"""The OpenAI frontend's own Prometheus metrics, on its port's `GET /metrics` (as vLLM serves its
own there): what the model behind it never sees, because the frontend answered first.

    trtspec_frontend_requests_total{route, status}   every answered request: its route (the
                                                     route's template, `/v1/responses/{rid}`;
                                                     `other` for no route) and HTTP status
    trtspec_frontend_refusals_total{route, param}    the 4xx answers that name a request parameter,
                                                     by that parameter, list positions collapsed
                                                     (`messages[3].content` -> `messages[].content`),
                                                     so a client the deployment keeps refusing (an
                                                     agent's field, a max_tokens over the limit) shows

Triton's metrics port keeps the model's (`trtspec_requests_total`, τ, queue time, …): a request the
frontend refused never reached it. Counted in this process only, from its start.
"""

from __future__ import annotations

import re
import threading
from collections import Counter

INDEX = re.compile(r"\[\d+\]")  # a list position in a parameter's path
MAX_PARAM_CHARS = 120  # a parameter label's longest (an unknown field's name is the client's text)


class FrontendMetrics:
    """Counters of answered requests and of refusals by parameter; thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str]] = Counter()  # (route, status)
        self.refusals: Counter[tuple[str, str]] = Counter()  # (route, param)

    def observe(self, route: str, status: int, param: str | None = None) -> None:
        """One answered request; `param`: the request parameter a 4xx named."""
        with self._lock:
            self.requests[route, str(status)] += 1
            if param and 400 <= status < 500:
                self.refusals[route, INDEX.sub("[]", param)[:MAX_PARAM_CHARS]] += 1

    def exposition(self) -> str:
        """The counters in Prometheus' text format (version 0.0.4)."""
        with self._lock:
            requests, refusals = sorted(self.requests.items()), sorted(self.refusals.items())
        lines = ["# HELP trtspec_frontend_requests_total Requests the OpenAI frontend answered, by route "
                 "and HTTP status.",
                 "# TYPE trtspec_frontend_requests_total counter"]
        lines += [f'trtspec_frontend_requests_total{{route="{_label(route)}",status="{status}"}} {n}'
                  for (route, status), n in requests]
        lines += ["# HELP trtspec_frontend_refusals_total 4xx answers of the OpenAI frontend that name a "
                  "request parameter, by route and parameter.",
                  "# TYPE trtspec_frontend_refusals_total counter"]
        lines += [f'trtspec_frontend_refusals_total{{route="{_label(route)}",param="{_label(param)}"}} {n}'
                  for (route, param), n in refusals]
        return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    """A label value escaped as the text format wants it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
