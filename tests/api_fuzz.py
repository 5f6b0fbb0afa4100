"""A fuzzer of the OpenAI frontend's request bodies: valid requests of every route (completions,
chat, Responses, Messages, count_tokens, tokenize, detokenize), each mutated at one to three random
places of its JSON tree (a field dropped, a value of another type or at a boundary, a list emptied
or doubled, an unknown key, a subtree of another request), sent to a running `trtspec serve`.

The routes without a body — a stored response read whole, as its events again (`stream`,
`starting_after`) or its input items (`limit`, `order`, `after`), cancelled, a model's card — are
sent mutated query strings and ids (`READS`).

What must hold for every body: the answer is a 200 or a 4xx, never a 5xx or a dropped connection;
a 4xx is the route's error shape with a message (OpenAI's `{"error": {"message", ...}}`, Anthropic's
`{"type": "error", "error": {...}}`); a 200 parses (a stream's every event is JSON and it ends as
its API ends one); no request hangs. `python -m tests.api_fuzz --url http://HOST:PORT --requests N`
runs it against any server; tests/test_openai.py runs a few hundred.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .mutate import Mutator

TOOL = {"type": "function", "function": {
    "name": "add", "description": "adds two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 4}},
          "required": ["answer"], "additionalProperties": False}

# (route, a valid body): every route with most of its fields set, and a few small ones
SEEDS: list[tuple[str, dict]] = [
    ("/v1/completions", {
        "model": "trtspec", "prompt": "Q: 12 + 30\nA:", "max_tokens": 8, "temperature": 0, "stop": ["\n"],
        "logprobs": 2, "echo": True}),
    ("/v1/completions", {
        "model": "trtspec", "prompt": ["import os\n", "def f(x):\n"], "max_tokens": 6, "temperature": 0.8,
        "top_p": 0.9, "top_k": 8, "min_p": 0.05, "seed": 3, "n": 2, "presence_penalty": 0.5,
        "frequency_penalty": 0.2, "repetition_penalty": 1.1, "logit_bias": {"65": -2.0}, "bad_words": ["ab"],
        "min_tokens": 2, "stop_token_ids": [10], "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/completions", {
        "model": "trtspec", "prompt": [81, 58, 32, 49], "max_tokens": 5,
        "structured_outputs": {"regex": "[0-9]+"}, "ignore_eos": False}),
    ("/v1/completions", {
        "model": "trtspec", "prompt": [[81, 58], [100, 101]], "max_tokens": 4, "guided_choice": ["yes", "no"],
        "include_stop_str_in_output": True, "add_special_tokens": False}),
    ("/v1/chat/completions", {
        "model": "trtspec", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "1 + 2"}], "name": "ann"},
            {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": "sum"},
            {"role": "tool", "tool_call_id": "call_1", "content": "3"},
            {"role": "user", "content": "and 4 + 4?"}],
        "tools": [TOOL], "tool_choice": "auto", "parallel_tool_calls": False, "max_tokens": 8,
        "temperature": 0, "logprobs": True, "top_logprobs": 2}),
    ("/v1/chat/completions", {
        "model": "trtspec", "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "add"}}, "max_completion_tokens": 24,
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
    ("/v1/chat/completions", {
        "model": "trtspec",
        "messages": [{"role": "developer", "content": "json"}, {"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}},
        "max_tokens": 16, "seed": 5, "temperature": 1, "n": 2,
        "chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "low",
        "thinking_token_budget": 4, "include_reasoning": True, "metadata": {"a": "b"},
        "store": False, "modalities": ["text"]}),
    ("/v1/chat/completions", {
        "model": "trtspec", "messages": [{"role": "user", "content": "q"}], "tools": [TOOL],
        "tool_choice": "required", "max_tokens": 32, "stream": True}),
    ("/v1/chat/completions", {
        "model": "trtspec", "messages": [{"role": "user", "content": "482 + 356"}], "max_tokens": 24,
        "prediction": {"type": "content", "content": [{"type": "text", "text": "838\n"}]}, "temperature": 0.7,
        "seed": 9, "prompt_cache_key": "k", "prompt_cache_retention": "in_memory", "verbosity": "medium",
        "safety_identifier": "u", "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/responses", {
        "model": "trtspec", "input": "Q: 3 + 4\nA:", "instructions": "Be brief.", "max_output_tokens": 8,
        "temperature": 0, "store": True}),
    ("/v1/responses", {
        "model": "trtspec", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "1 + 2"}]},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "sum"}]},
            {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 1, "b": 2}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "3"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "3"}]},
            {"type": "message", "role": "user", "content": "and 5?"}],
        "tools": [
            {"type": "function", "name": "add", "description": "adds",
             "parameters": TOOL["function"]["parameters"], "strict": True},
            {"type": "namespace", "name": "fs", "description": "files", "tools": [
                {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {}}}]},
            {"type": "web_search"}],
        "tool_choice": "auto", "max_output_tokens": 24, "stream": True, "reasoning": {"effort": "low"},
        "client_metadata": {"turn": "1"}, "parallel_tool_calls": True, "include": []}),
    ("/v1/responses", {
        "model": "trtspec", "input": "x",
        "text": {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA, "strict": True}},
        "max_output_tokens": 16, "tool_choice": "none", "truncation": "disabled", "top_logprobs": 0,
        "background": False}),
    ("/v1/responses", {
        "model": "trtspec", "input": "Q: 5 + 6\nA:", "max_output_tokens": 12, "background": True,
        "stream": True, "temperature": 0, "metadata": {"job": "7"}, "top_logprobs": 2,
        "include": ["message.output_text.logprobs"], "chat_template_kwargs": {"enable_thinking": False}}),
    ("/v1/responses", {  # past the context: both long turns dropped (truncation auto), "3 + 4" answered
        "model": "trtspec", "instructions": "Arithmetic.", "truncation": "auto", "max_output_tokens": 8,
        "input": [{"role": "user", "content": "1 + " + "1" * 4000}, {"role": "assistant", "content": "2"},
                  {"role": "user", "content": "2 + " + "2" * 4000}, {"role": "assistant", "content": "4"},
                  {"role": "user", "content": "3 + 4"}]}),
    ("/v1/conversations", {
        "items": [{"role": "system", "content": "Arithmetic."},
                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "1 + 2"}]},
                  {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 1}'},
                  {"type": "function_call_output", "call_id": "c1", "output": "3"}],
        "metadata": {"topic": "sums"}}),
    ("/v1/conversations/{cid}/items", {"items": [{"role": "user", "content": "and 4?"}]}),
    ("/v1/conversations/{cid}", {"metadata": {"topic": "more"}}),
    ("/v1/messages", {
        "model": "trtspec", "max_tokens": 8, "system": [{"type": "text", "text": "Be brief."}], "messages": [
            {"role": "user", "content": "1 + 2"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "sum", "signature": ""},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"},
                {"type": "text", "text": "and 4?"}]}],
        "tools": [{"name": "add", "description": "adds", "input_schema": TOOL["function"]["parameters"]}],
        "tool_choice": {"type": "auto"}, "temperature": 0, "stop_sequences": ["\n"]}),
    ("/v1/messages", {
        "model": "trtspec", "max_tokens": 24, "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "thinking": {"type": "adaptive"}, "top_k": 5, "top_p": 0.9, "output_config": {"effort": "low"},
        "metadata": {"user_id": "u"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}),
    ("/v1/messages", {
        "model": "trtspec", "max_tokens": 16, "messages": [{"role": "user", "content": "x"}],
        "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
        "tools": [{"name": "add", "input_schema": TOOL["function"]["parameters"]}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}),
    ("/v1/messages", {
        "model": "trtspec", "max_tokens": 1100, "messages": [{"role": "user", "content": "7 + 8"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024}}),
    ("/v1/messages/count_tokens", {
        "model": "trtspec", "system": "s",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        "tools": [{"name": "add", "input_schema": TOOL["function"]["parameters"]}]}),
    ("/tokenize", {
        "model": "trtspec", "prompt": "hello", "add_special_tokens": True, "return_token_strs": True}),
    ("/tokenize", {
        "messages": [{"role": "user", "content": "hello"}], "tools": [TOOL],
        "chat_template_kwargs": {"enable_thinking": True}}),
    ("/detokenize", {"model": "trtspec", "tokens": [104, 105]}),
    # Triton's own generate endpoints (the model's inputs by name, TensorRT-LLM's)
    ("/v2/models/trtspec/generate", {"text_input": "Q: 1 + 2\nA:", "max_tokens": 8, "temperature": 0.0,
                                     "prediction": " 3\nQ: 2 + 2\nA: 4"}),
    ("/v2/models/trtspec/generate", {
        "text_input": "import os\n", "max_tokens": 6, "temperature": 0.8, "top_p": 0.9, "top_k": 8,
        "min_p": 0.05, "random_seed": 3, "stop_words": ["\n"], "bad_words": ["ab"], "presence_penalty": 0.5,
        "frequency_penalty": 0.2, "repetition_penalty": 1.1, "min_tokens": 2, "return_log_probs": True,
        "num_top_log_probs": 2, "logit_bias_ids": [65], "logit_bias_values": [-2.0],
        "exclude_input_in_output": True}),
    ("/v2/models/trtspec/generate", {
        "text_input": "x", "max_tokens": 8, "guided_decoding_guide_type": "regex",
        "guided_decoding_guide": "[0-9]+", "add_special_tokens": False}),
    ("/v2/models/trtspec/generate", {
        "text_input": "Q: 9 + 9\nA:", "max_tokens": 8, "thinking_token_budget": 2, "thinking_start": "A:",
        "thinking_end": "</think>", "stop_token_ids": [10], "ignore_eos": False, "end_id": 0, "pad_id": 0}),
    ("/v2/models/trtspec/generate_stream", {
        "input_ids": [81, 58, 32, 49], "max_tokens": 6, "stream": True, "num_return_sequences": 1,
        "beam_width": 1, "seed": 4, "temperature": 1.0}),
]

# values a request's field may be given besides mutate.ODD's: its words, tags, guides' pieces
ODD = ["auto", "none", "required", "text", "json_object", "function", "user", "assistant", "tool", "system",
       "<tool_call>", "</think>", "[0-9", "(a|", {"type": "text"}, {"type": "function"}, {"type": "object"},
       # what a JSON schema, a regex or a grammar may hold that a guide must refuse or compile
       {"type": "string", "pattern": "(a"}, {"type": "string", "pattern": "a{1000000}"},
       {"$ref": "#/$defs/x"}, {"enum": []}, {"anyOf": []}, {"type": ["string", "null"]},
       {"type": "integer", "minimum": 5, "maximum": 1}, {"type": "array", "minItems": 3, "maxItems": 1},
       {"type": "string", "format": "date-time"}, {"type": "integer", "multipleOf": 0}, {"const": {"a": [1]}},
       {"additionalProperties": {"type": "integer"}},
       {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, {"not": {}},
       {"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, {"type": "nonsense"},
       {"type": "string", "minLength": 10 ** 9}, "[a-", "a{1000000}", "\\p{L}+", "root ::= ", "root ::= x",
       'root ::= "a" | ', "<|endoftext|>", "<think>"]
# (method, route, a valid query) of the routes without a body; {rid}: a stored response's id
READS: list[tuple[str, str, dict[str, str]]] = [
    ("GET", "/v1/responses/{rid}", {}),
    ("GET", "/v1/responses/{rid}", {"stream": "true", "starting_after": "2"}),
    ("GET", "/v1/responses/{rid}/input_items", {"limit": "1", "order": "asc"}),
    ("POST", "/v1/responses/{rid}/cancel", {}),
    ("GET", "/v1/models/{model}", {}),
    ("GET", "/v1/conversations/{cid}", {}),
    ("GET", "/v1/conversations/{cid}/items", {"limit": "2", "order": "asc"}),
    ("GET", "/v1/conversations/{cid}/items/{item}", {}),
    ("DELETE", "/v1/conversations/{cid}/items/{item}", {}),
]
# tritonserver 2.51's HTTP generate answers a value of the wrong JSON type (`"max_tokens": "x"`), and
# JSON its parser refuses (half a surrogate pair, "\\ud800"), with a 500 of its own before any model
# sees the request; counted apart, not trtspec's to answer
UPSTREAM_500 = ("Unable to parse ", "failed to parse the request JSON buffer")
MUTATOR = Mutator(ODD, [body for _, body in SEEDS], ["extra", "type", "name", "content", "text", "role"])


@dataclass
class Outcome:
    route: str
    body: dict
    status: int
    problem: str = ""  # what broke the rules, empty when nothing did
    upstream: bool = False  # Triton's own 500 for a value of the wrong JSON type (UPSTREAM_500)
    dropped: bool = False  # the client left after its first bytes
    path: str = ""  # a route without a body: its path as sent (ids, query)
    text: str = field(default="", repr=False)


def _error_message(route: str, answer) -> str:
    """The message of an error answer in its route's shape, or "" when it has none."""
    if not isinstance(answer, dict):
        return ""
    if route.startswith("/v2/"):  # Triton's: {"error": "..."}, generate_stream's as an event
        return answer["error"] if isinstance(answer.get("error"), str) else ""
    if route.startswith("/v1/messages"):
        error = answer.get("error") if answer.get("type") == "error" else None
    else:
        error = answer.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else ""


def _json(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _stream_problem(route: str, text: str) -> str:
    """What is wrong with a 200's event stream, or ""."""
    datas = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    if not datas:
        return "a stream with no events"
    events = []
    for data in datas:
        if data == "[DONE]":
            continue
        try:
            events.append(json.loads(data))
        except json.JSONDecodeError:
            return f"an event that is no JSON: {data[:200]!r}"
    if route.startswith("/v2/"):
        return ""  # Triton's stream ends when its last response is sent; an error is an event of its own
    if route in ("/v1/completions", "/v1/chat/completions"):
        if datas[-1] != "[DONE]":
            return "a stream that does not end with [DONE]"
    elif route == "/v1/responses":
        if events[-1].get("type") not in ("response.completed", "response.incomplete", "response.failed",
                                          "error"):
            return f"a Responses stream ending with {events[-1].get('type')!r}"
    elif route == "/v1/messages":
        if events[-1].get("type") not in ("message_stop", "error"):
            return f"a Messages stream ending with {events[-1].get('type')!r}"
    return ""


def send(base: str, route: str, body, key: str | None = None, timeout: float = 60,
         triton: str | None = None, drop_after: int | None = None, method: str = "POST",
         path: str | None = None) -> Outcome:
    """POST `body` to `base + route` (Triton's routes, /v2/..., to `triton`) and judge the answer;
    a route without a body (`READS`): `method` with `body` None, at `path` (its ids and query).
    `drop_after`: read that many bytes of a 200 and close the connection, as a client that leaves."""
    if route.startswith("/v2/"):
        base = triton
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + (path or route), data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            if drop_after is not None:
                resp.read(drop_after)
                return Outcome(route, body, resp.status, dropped=True)
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode(errors="replace")
    except Exception as exc:  # a dropped connection, a hang: what must never happen
        return Outcome(route, body, 0, f"no answer: {type(exc).__name__}: {exc}")
    outcome = Outcome(route, body, status, text=text, path=path or "")
    if status >= 400 and route.endswith("generate_stream") and text.startswith("data: "):
        text = text[6:]  # Triton's stream sends an error as its one event
    if status >= 500:
        message = _error_message(route, _json(text))
        outcome.upstream = route.startswith("/v2/") and message.startswith(UPSTREAM_500)
        if not outcome.upstream:
            outcome.problem = f"status {status}: {text[:300]}"
    elif status >= 400:
        message = _error_message(route, _json(text))
        if not message:
            outcome.problem = f"a {status} without an error message in the route's shape: {text[:300]}"
        elif "Traceback" in message or "RecursionError" in message:
            outcome.problem = f"a traceback in the message: {message[:300]}"
    elif status != 200:  # a redirect (which a client re-sending its body may not follow), …
        outcome.problem = f"status {status}: {text[:300]}"
    elif route.endswith("generate_stream") or isinstance(body, dict) and body.get("stream") is True:
        outcome.problem = _stream_problem(route, text)
    elif text.startswith("event: "):  # a stored background response's events again
        outcome.problem = _stream_problem("/v1/responses", text)
    elif _json(text) is None:
        outcome.problem = f"a 200 that is no JSON: {text[:300]}"
    return outcome


def stored(base: str, key: str | None) -> dict[str, list[str]]:
    """Ids for the routes that name a stored object: two responses (`rid`), both ended, a background
    one (its events kept) and one answered in the foreground; a conversation (`cid`) and its
    items (`item`)."""
    ids = []
    for background in (True, False):
        body = {"model": "trtspec", "input": "Q: 2 + 2\nA:", "max_output_tokens": 8, "temperature": 0,
                "background": background}
        outcome = send(base, "/v1/responses", body, key)
        assert outcome.status == 200, outcome.text[:300]
        ids.append(json.loads(outcome.text)["id"])
    deadline = time.monotonic() + 60
    while json.loads(send(base, "/v1/responses/{rid}", None, key, method="GET",
                          path=f"/v1/responses/{ids[0]}").text)["status"] in ("queued", "in_progress"):
        assert time.monotonic() < deadline, "a background response did not end"
        time.sleep(0.05)
    conversation = [body for route, body in SEEDS if route == "/v1/conversations"][0]
    cid = json.loads(send(base, "/v1/conversations", conversation, key).text)["id"]
    listed = json.loads(send(base, "/v1/conversations/{cid}/items", None, key, method="GET",
                             path=f"/v1/conversations/{cid}/items").text)
    return {"rid": ids, "cid": [cid], "item": [item["id"] for item in listed["data"]]}


def with_ids(rng: random.Random, route: str, ids: dict[str, list[str]]) -> str:
    """`route` with each of its ids a stored object's (mostly), another, or one edited."""
    names = {"model": ["trtspec"], **ids}
    chosen = {name: rng.choice([*known, *known, *known, "nope", MUTATOR.value(rng, known[0])])
              for name, known in names.items()}
    return route.format(**{name: urllib.parse.quote(str(value), safe="", errors="surrogatepass")
                            for name, value in chosen.items()})


def seed_path(route: str, ids: dict[str, list[str]]) -> str:
    """`route` with the ids of the stored objects (a seed's, as written)."""
    return route.format(model="trtspec", **{name: known[0] for name, known in ids.items()})


def read_path(rng: random.Random, route: str, query: dict[str, str], ids: dict[str, list[str]]) -> str:
    """`route` with its ids (`with_ids`) and `query`, mutated: a value replaced by an odd one as
    text, a parameter dropped or an unknown one added."""
    query = dict(query)
    for _ in range(rng.randint(0, 2)):
        roll = rng.random()
        if query and roll < 0.2:
            del query[rng.choice(list(query))]
        elif roll < 0.4:
            query[rng.choice(["stream", "starting_after", "limit", "order", "after", "x"])] = "1"
        elif query:
            name = rng.choice(list(query))
            value = MUTATOR.value(rng, query[name])
            query[name] = value if isinstance(value, str) else json.dumps(value)
    # a value holding half a surrogate pair goes as the bytes it would be (invalid UTF-8 in the URL)
    query = urllib.parse.urlencode(query, errors="surrogatepass")
    return with_ids(rng, route, ids) + ("?" + query if query else "")


def fuzz(base: str, triton: str | None, requests: int, seed: int, key: str | None = None,
         clients: int = 1, drop: float = 0.0, max_mutations: int = 3):
    """Send `requests` mutated bodies to the frontend at `base` (and Triton's HTTP at `triton`,
    None: none of its routes) from `clients` threads at once, a `drop` fraction of them left by the
    client after its first bytes; every tenth a route without a body (READS), its query mutated.
    Yields each Outcome in the order the requests were drawn."""
    rng = random.Random(seed)
    routes = sorted({route for route, _ in SEEDS if triton or not route.startswith("/v2/")})
    ids = stored(base, key)
    sends = []
    for _ in range(requests):
        if rng.random() < 0.1:
            method, route, query = rng.choice(READS)
            sends.append((route, None, None, method, read_path(rng, route, query, ids)))
            continue
        route = rng.choice(routes)  # each route as often, whatever its seeds
        body = rng.choice([body for seed_route, body in SEEDS if seed_route == route])
        count = 1 if rng.random() < 0.5 else rng.randint(2, max_mutations)  # one change reaches furthest
        drop_after = rng.randint(1, 400) if rng.random() < drop else None
        path = with_ids(rng, route, ids) if "{" in route else None
        sends.append((route, MUTATOR.mutate(rng, body, count), drop_after, "POST", path))
    with ThreadPoolExecutor(clients) as pool:
        yield from pool.map(lambda s: send(base, s[0], s[1], key, triton=triton, drop_after=s[2], method=s[3],
                                           path=s[4]), sends)


# requests whose answers must be the same before and after a fuzz: what one request leaves behind
# (a slot's cache, penalties, a guide, a seed) must not reach the next
PROBES: list[tuple[str, dict]] = [
    ("/v1/completions", {"model": "trtspec", "prompt": "Q: 482 + 356\nA:", "max_tokens": 24, "temperature": 0,
                         "logprobs": 2}),
    ("/v1/completions", {"model": "trtspec", "prompt": "def parse(self, text):\n", "max_tokens": 24,
                         "temperature": 1, "top_k": 8, "seed": 11}),
    ("/v1/chat/completions", {"model": "trtspec", "messages": [{"role": "user", "content": "7 + 5"}],
                              "max_tokens": 16, "temperature": 0}),
    ("/v1/messages", {"model": "trtspec", "max_tokens": 16,
                      "messages": [{"role": "user", "content": "9 + 4"}],
                      "temperature": 0}),
    ("/v2/models/trtspec/generate", {"text_input": "import os\n", "max_tokens": 24, "temperature": 0.0}),
]


def probe(base: str, triton: str | None, key: str | None = None, sampled: bool = False) -> list:
    """The answers to PROBES (their texts and log-probabilities, not their ids or timestamps); the
    `sampled` one too (a seeded text is the same whatever the draft lengths only under
    `sampling.coupling: gumbel`; under rejection sampling another draw of the same law)."""
    answers = []
    for route, body in PROBES:
        if route.startswith("/v2/") and triton is None or body.get("temperature") and not sampled:
            continue
        outcome = send(base, route, body, key, triton=triton)
        assert outcome.status == 200, (route, outcome.status, outcome.text[:300])
        answer = json.loads(outcome.text)
        for volatile in ("id", "created", "model_version", "usage", "trtspec", "accepted_tokens",
                         "draft_tokens", "target_forwards", "cached_tokens"):
            answer.pop(volatile, None)  # timing-dependent: adaptive drafting, prefix reuse
        answers.append(answer)
    return answers


def difference(was, now, path: str = "") -> str | None:
    """Where two probe answers differ (floats by more than 1e-4: a prompt served from the prefix
    cache is computed in other pieces), or None."""
    if isinstance(was, float) and isinstance(now, float):
        return None if abs(was - now) <= 1e-4 else f"{path}: {was} vs {now}"
    if isinstance(was, dict) and isinstance(now, dict) and was.keys() == now.keys():
        return next((d for k in was if (d := difference(was[k], now[k], f"{path}.{k}"))), None)
    if isinstance(was, list) and isinstance(now, list) and len(was) == len(now):
        return next((d for i, (a, b) in enumerate(zip(was, now, strict=True))
                     if (d := difference(a, b, f"{path}[{i}]"))), None)
    return None if was == now else f"{path}: {json.dumps(was)[:300]} vs {json.dumps(now)[:300]}"


def main() -> None:
    import argparse
    from collections import Counter

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the frontend's base, http://HOST:PORT")
    parser.add_argument("--triton", default=None,
                        help="Triton's HTTP base, http://HOST:PORT (its generate routes)")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--clients", type=int, default=1, help="requests in flight at once")
    parser.add_argument("--drop", type=float, default=0.0,
                        help="fraction of requests the client leaves early")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--key", default=None)
    parser.add_argument("--gumbel", action="store_true",
                        help="the server samples with sampling.coupling gumbel: probe a seeded sampled "
                        "text too")
    args = parser.parse_args()
    before = probe(args.url, args.triton, args.key, args.gumbel)
    statuses, problems = Counter(), []
    for i, outcome in enumerate(fuzz(args.url, args.triton, args.requests, args.seed, args.key,
                                     args.clients, args.drop)):
        kind = " (Triton parsing)" if outcome.upstream else " (dropped)" if outcome.dropped else ""
        statuses[outcome.route, f"{outcome.status}{kind}"] += 1
        if outcome.problem:
            problems.append(outcome)
            sent = outcome.path if outcome.body is None else f"body: {json.dumps(outcome.body)[:1500]}"
            print(f"#{i} {outcome.route} {outcome.problem}\n  {sent}", flush=True)
    for (route, status), count in sorted(statuses.items()):
        print(f"{route:35} {status}: {count}")
    after = probe(args.url, args.triton, args.key, args.gumbel)
    changed = [f"#{i}{d}" for i, (was, now) in enumerate(zip(before, after, strict=True))
               if (d := difference(was, now))]
    for change in changed:
        print(f"probe changed: {change}")
    print(f"{len(problems)} problems in {args.requests} requests; "
          f"probes {'CHANGED' if changed else 'unchanged'}")


if __name__ == "__main__":
    main()
