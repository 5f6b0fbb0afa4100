"""A fuzzer of trtspec's clients (`trtspec generate/verify/bench --url`): a loopback proxy in front
of a real server passes each request on and changes the answer at random before the client reads
it — a field of the JSON at one or two places (tests/mutate.py), an event of a stream, the stream
cut short or without its end, text that is no JSON, another status. A server other than trtspec's
(trtllm-serve, vLLM, SGLang, a proxy in between) may answer anything; the client must then fail
with a ClientError that says what it got, never a traceback.
"""

from __future__ import annotations

import json
import random
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from trtspec.triton.client import ClientError, GenerateParams, generate

from .mutate import Mutator

# values an answer's field may be given besides mutate.ODD's
ODD = ["stop", "length", "assistant", "text_completion", "chat.completion.chunk", {"content": 5},
       {"content": None}, [{"text": 1}], {"completion_tokens": "x"}, {"seed": "x"}, [{"delta": []}]]
GARBAGE = [b"", b"{", b"null", b"[]", b"42", b'"x"', b"[DONE]", b'{"error": 5}', b'{"error": {"message": 5}}',
           b'{"choices": 5}', b'{"text_output": ["a", "b"]}', b"\xff\xfe"]


class MutatingProxy:
    """`http://127.0.0.1:PORT` passing requests to `upstream` and changing every answer once
    (`rate`: the share changed; the others pass whole), with `seed`'s random choices."""

    def __init__(self, upstream: str, seed: int, rate: float = 1.0):
        self.upstream, self.rng, self.rate, self.lock = upstream, random.Random(seed), rate, threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                proxy.forward(self, None)

            def do_POST(self):
                proxy.forward(self, self.rfile.read(int(self.headers.get("Content-Length", 0))))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> MutatingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def forward(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> None:
        headers = {k: v for k, v in handler.headers.items() if k.lower() in ("content-type", "authorization")}
        req = urllib.request.Request(self.upstream + handler.path, data=body, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                status, kind, raw = resp.status, resp.headers.get("Content-Type", ""), resp.read()
        except urllib.error.HTTPError as exc:
            status, kind, raw = exc.code, exc.headers.get("Content-Type", ""), exc.read()
        with self.lock:
            if self.rng.random() < self.rate:
                status, raw = self.change(status, kind, raw)
        handler.send_response(status)
        handler.send_header("Content-Type", kind or "application/json")
        handler.send_header("Content-Length", str(len(raw)))
        handler.end_headers()
        handler.wfile.write(raw)

    def change(self, status: int, kind: str, raw: bytes) -> tuple[int, bytes]:
        rng = self.rng
        roll = rng.random()
        if roll < 0.05:
            return rng.choice([200, 400, 404, 500, 503]), rng.choice(GARBAGE)
        if "text/event-stream" not in kind:
            if roll < 0.2:
                return status, rng.choice(GARBAGE)
            return status, self.mutate(raw)
        lines = raw.split(b"\n")
        events = [i for i, line in enumerate(lines) if line.startswith(b"data:")]
        if not events:
            return status, raw
        if roll < 0.2:  # cut short: the client must not hang or take half an answer as whole
            return status, b"\n".join(lines[: rng.choice(events)])
        at = rng.choice(events)
        data = lines[at][len(b"data:"):].strip()
        lines[at] = b"data: " + (rng.choice(GARBAGE) if roll < 0.35 else self.mutate(data))
        return status, b"\n".join(lines)

    def mutate(self, raw: bytes) -> bytes:
        try:
            tree = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return raw
        if not isinstance(tree, dict):
            return raw
        mutator = Mutator(ODD, [tree], ["error", "choices", "text", "delta", "usage", "trtspec",
                                        "output_ids"])
        return json.dumps(mutator.mutate(self.rng, tree, self.rng.randint(1, 2))).encode()


@dataclass
class Outcome:
    how: str  # the request, for the report
    problem: str  # what broke the rules, empty when nothing did
    refused: bool = False  # the client raised a ClientError


def ask(url: str, model: str, key: str | None, how: dict) -> Outcome:
    """One generate() through the proxy: a Completion or a ClientError, nothing else."""
    params = GenerateParams(max_tokens=how["max_tokens"], stream=how["stream"],
                            temperature=how["temperature"], seed=how.get("seed"))
    try:
        completion = generate(url, model, how["prompt"], params, timeout_s=60, chat=how["chat"], api_key=key)
    except ClientError as exc:
        text = str(exc)
        return Outcome(str(how), "an empty error" if not text.strip() else "", refused=True)
    except Exception as exc:  # noqa: BLE001 - what the fuzz is looking for
        return Outcome(str(how), f"{type(exc).__name__}: {exc}")
    if not isinstance(completion.text, str):
        return Outcome(str(how), f"a text that is no string: {completion.text!r}")
    return Outcome(str(how), "")


def fuzz(openai: str | None, triton: str | None, model: str, requests: int, seed: int,
         key: str | None = None):
    """`requests` requests through proxies of the OpenAI frontend at `openai` (http://HOST:PORT)
    and Triton's HTTP at `triton`; yields each Outcome."""
    rng = random.Random(seed)
    with MutatingProxy(openai or "", seed) as to_openai, MutatingProxy(triton or "", seed + 1) as to_triton:
        for _ in range(requests):
            scheme = rng.choice([s for s, up in (("openai", openai), ("http", triton)) if up])
            how = {"prompt": rng.choice(["Q: 1 + 2\nA:", "import os\n", "def f(x):\n"]),
                   "max_tokens": rng.randint(1, 16), "stream": rng.random() < 0.6,
                   "temperature": rng.choice([0.0, 1.0]), "seed": rng.randint(0, 99),
                   "chat": scheme == "openai" and rng.random() < 0.5}
            proxy = to_openai if scheme == "openai" else to_triton
            yield ask(f"{scheme}://{proxy.url}", model, key, how)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--openai", help="the OpenAI frontend, http://HOST:PORT")
    parser.add_argument("--triton", help="Triton's HTTP, http://HOST:PORT")
    parser.add_argument("--model", default="trtspec")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--key", default=None)
    args = parser.parse_args()
    problems = refused = 0
    outcomes = fuzz(args.openai, args.triton, args.model, args.requests, args.seed, args.key)
    for i, outcome in enumerate(outcomes):
        refused += outcome.refused
        if outcome.problem:
            problems += 1
            print(f"#{i} {outcome.problem}\n  {outcome.how}", flush=True)
    print(f"{problems} problems in {args.requests} requests ({refused} refused by the client)")


if __name__ == "__main__":
    main()
