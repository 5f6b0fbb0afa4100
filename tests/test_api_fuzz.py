"""Bad input never breaks `trtspec serve`: valid requests of every route, mutated at random places
(tests/api_fuzz.py), sent by two clients at once (some leaving mid-answer) to a served model whose
chat template writes tools, tool results and reasoning (so the mutations reach past the parsing into
the template, the guides, tool calls and the Triton model). Every answer must be a 200 or a 4xx in
its route's shape, and the answers of fixed probe requests must be the same after the fuzz as
before it: nothing one request did reaches the next. And the other way round, bad answers never
break trtspec's clients: the same server's answers changed at random on their way back
(tests/answer_fuzz.py) are read or refused with a ClientError that shows what came."""

from __future__ import annotations

import json
import re
import urllib.request
from collections import Counter

import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.config import load_build_config

from . import answer_fuzz, api_fuzz
from .conftest import REPO, local_target, serve_cli

CONFIG = REPO / "build_configs" / "tiny-dflash.yaml"
KEY = "fuzz-key-0123"
# ~25 s here; 300 left a route (Triton's generate, whose own JSON parser answers most mutations with
# a 500) without a 200 once the seeds changed. `python -m tests.api_fuzz` runs thousands against any server
REQUESTS = 400
ANSWERS = 150  # answers changed on their way back to the clients; `python -m tests.answer_fuzz` runs more

# the embedded model's Q/A turns, with what chat, Responses and Messages may send: tools, calls,
# their results, reasoning, and Qwen3's answer opening when thinking is off
TOOL_TEMPLATE = """\
{%- if tools %}<tools>{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>
{% endif -%}
{%- for m in messages -%}
{%- if m.role in ('system', 'developer') %}{{ m.content }}
{% elif m.role == 'user' %}Q: {{ m.content }}
{% elif m.role == 'assistant' %}A: {% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>
{%- endif -%}
{{ m.content or '' }}{% for c in m.tool_calls or [] %}<tool_call>{"name": "{{ c.function.name }}", \
"arguments": {{ c.function.arguments }}}</tool_call>{% endfor %}
{% elif m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>
{% endif -%}
{%- endfor -%}
A: {% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`trtspec serve` of the embedded DFlash deployment with TOOL_TEMPLATE, hermes tool calls,
    Qwen3's reasoning parser and Gumbel coupling, with an API key."""
    out = tmp_path_factory.mktemp("fuzz")
    local = local_target(out, load_build_config(CONFIG), TOOL_TEMPLATE)
    yaml = out / "fuzz.yaml"
    # Gumbel coupling: a seeded text is the same whatever the draft lengths, so a sampled probe too
    yaml.write_text(CONFIG.read_text().replace("builtin:tiny-target", local.target.path)
                    + "sampling:\n  coupling: gumbel\n")
    assert CliRunner().invoke(main, ["build", str(yaml), "--out", str(out / "build")]).exit_code == 0
    parsers = ("--tool-call-parser", "hermes", "--reasoning-parser", "qwen3")
    with serve_cli(out / "build", KEY, args=parsers) as served:
        yield served


def test_the_seeds_are_served():
    """Every seed is a valid request of its route (else its mutations would test one refusal)."""
    assert {route for route, _ in api_fuzz.SEEDS} == {
        "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
        "/v1/messages/count_tokens", "/tokenize", "/detokenize", "/v2/models/trtspec/generate",
        "/v2/models/trtspec/generate_stream", "/v1/conversations", "/v1/conversations/{cid}",
        "/v1/conversations/{cid}/items"}


def test_mutated_requests_get_answers_and_leave_nothing_behind(served):
    ids = api_fuzz.stored(served.base, KEY)
    for route, body in api_fuzz.SEEDS:  # valid as written
        outcome = api_fuzz.send(served.base, route, body, KEY, triton=served.http,
                                path=api_fuzz.seed_path(route, ids))
        assert (outcome.status, outcome.problem) == (200, ""), (route, outcome.text[:500])
    before = api_fuzz.probe(served.base, served.http, KEY, sampled=True)
    outcomes = list(api_fuzz.fuzz(served.base, served.http, REQUESTS, seed=2026, key=KEY, clients=2,
                                  drop=0.1))
    problems = [f"{o.route} {o.problem}: {o.body}" for o in outcomes if o.problem]
    assert not problems, "\n".join(problems[:5])
    # the mutations reached past the parsing: every route with a body answered both 200s and 4xx, the
    # routes without one (a few requests each) together
    statuses = Counter((o.route, o.status // 100) for o in outcomes if not o.dropped)
    for route in {route for route, _ in api_fuzz.SEEDS}:
        assert statuses[route, 2] and statuses[route, 4], (route, statuses)
    reads = Counter(o.status // 100 for o in outcomes if o.body is None)
    assert reads[2] and reads[4] and not set(reads) - {2, 4}, reads
    after = api_fuzz.probe(served.base, served.http, KEY, sampled=True)
    changes = [api_fuzz.difference(was, now) for was, now in zip(before, after, strict=True)]
    assert changes == [None] * len(before)
    with urllib.request.urlopen(f"{served.base}/health", timeout=10) as resp:
        assert resp.status == 200
    log = open(served.log).read()
    assert not re.search(r"Traceback|Exception in ASGI", log), log[-3000:]


def test_clients_read_any_answer_or_say_what_came(served, tmp_path):
    outcomes = list(answer_fuzz.fuzz(served.base, served.http, "trtspec", ANSWERS, seed=2026, key=KEY))
    problems = [f"{o.problem}: {o.how}" for o in outcomes if o.problem]
    assert not problems, "\n".join(problems[:5])
    refused = sum(o.refused for o in outcomes)
    assert 0 < refused < len(outcomes)  # some changes the clients refuse, others leave a readable answer
    # through the CLI: a stream cut short is one Error: line, not a text taken as whole
    with answer_fuzz.MutatingProxy(served.base, seed=1) as proxy:
        proxy.change = lambda status, kind, raw: (status, raw.split(b"data: [DONE]")[0])
        result = CliRunner().invoke(main, ["generate", "--url", f"openai://{proxy.url}", "--api-key", KEY,
                                           "--prompt", "Q: 1 + 2\nA:", "--max-tokens", "8", "--stream"])
        assert result.exit_code == 1 and result.output.count("Error: ") == 1, result.output
        assert "the stream ended without its `data: [DONE]` (cut short)" in result.output


DEEP = "[" * 5000 + "]" * 5000  # JSON text nested past what Python's parser recurses
HUGE = '{"a": ' + "9" * 5000 + "}"  # JSON text with an integer past Python's 4,300 digits
SCHEMA_LEVELS = 300  # nested arrays: past grammar.MAX_SCHEMA_DEPTH (its grammar would take ~1 s to build)
DEEP_SCHEMA = {"type": "string"}
for _ in range(SCHEMA_LEVELS):
    DEEP_SCHEMA = {"type": "array", "items": DEEP_SCHEMA}
CHAT = {"model": "trtspec", "max_tokens": 4, "messages": [{"role": "user", "content": "1 + 2"}]}
CALL_ARGS = "messages[1].tool_calls[0].function.arguments"


def _chat_with_call(arguments: str) -> dict:
    call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": arguments}}
    return {**CHAT, "messages": [{"role": "user", "content": "1 + 2"},
                                 {"role": "assistant", "content": None, "tool_calls": [call]},
                                 {"role": "tool", "tool_call_id": "c", "content": "3"}]}


# what a fuzzing session (2026-12-05) found answered with a 500, a traceback's words or no parameter:
# (route, body, the parameter the 400 must name)
FOUND = [
    ("/v1/completions", {"model": "trtspec", "prompt": "a\ud800", "max_tokens": 4}, "prompt"),
    ("/v1/completions", {"model": "trtspec", "prompt": "x", "\ud800": 1}, None),  # a key
    ("/v1/completions", {"model": "\ud800", "prompt": "x"}, "model"),
    ("/v1/chat/completions", {**CHAT, "stop": ["\ud800"]}, "stop[0]"),
    ("/v1/chat/completions", {**CHAT, "cache_salt": "a\udfff"}, "cache_salt"),
    ("/v1/conversations", {"items": [{"type": "message", "role": "user", "content": "\ud800"}]},
     "items[0].content"),
    ("/tokenize", {"prompt": "\ud800"}, "prompt"),
    ("/v1/chat/completions", _chat_with_call(DEEP), CALL_ARGS),
    ("/v1/chat/completions", _chat_with_call(HUGE), CALL_ARGS),
    ("/v1/responses", {"model": "trtspec", "max_output_tokens": 4, "input": [
        {"role": "user", "content": "1 + 2"},
        {"type": "function_call", "call_id": "c", "name": "add", "arguments": DEEP}]}, "input[1].arguments"),
    ("/v1/chat/completions", {**CHAT, "guided_json": DEEP}, "guided_json"),
    ("/v1/chat/completions", {**CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "deep", "schema": DEEP_SCHEMA}}}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "structured_outputs": {"json": DEEP_SCHEMA,
                                                             "disable_any_whitespace": True}},
     "structured_outputs"),
    *[("/v1/completions", {"model": "trtspec", "prompt": "x", "repetition_penalty": penalty},
       "repetition_penalty") for penalty in (1e39, 1e-300)],  # past a float32 (the model's): inf, 0
    ("/v1/responses", {"model": "trtspec", "input": "hi", "metadata": {"a": 1}}, "metadata.a"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "text", "x": 1}}, "response_format.x"),
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"x": json.loads("[" * 500 + "]" * 500)}},
     "chat_template_kwargs"),  # the template's rendering recursed past Python's limit
    ("/v1/chat/completions", {**CHAT, "prediction": {"type": "content", "content": "x" * 5000}},
     "prediction"),  # more tokens than the context
    ("/v1/completions", {"model": "trtspec", "prompt": "x", "max_tokens": 4, "ignore_eos": True,
                         "guided_json": {"type": "object"}}, "ignore_eos"),  # found reading the README
    ("/v1/responses", {"model": "trtspec", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
     "input[0].content[0].text"),  # a value of the wrong type, once called missing
    ("/v1/conversations", {"items": [{"role": "user", "content": "x", "id": {"a": 1}}]}, "items[0].id"),
    ("/v1/conversations", {"items": [{"role": "user", "content": "x", "status": "weird"}]},
     "items[0].status"),
    # Anthropic's error shape names no parameter: its message does
    ("/v1/messages", {"model": "trtspec", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                      "tool_choice": {"type": "auto", "disable_parallel_tool_use": "x"}},
     "tool_choice.disable_parallel_tool_use"),
    ("/v1/messages", {"model": "trtspec", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                      "metadata": {"user_id": 5}}, "metadata.user_id"),
    ("/v1/messages", {"model": "trtspec", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content[0].text"),
]


@pytest.mark.parametrize("route, body, param", FOUND, ids=[f"{i}-{route}" for i, (route, _, _) in
                                                              enumerate(FOUND)])
def test_what_a_fuzzing_session_found_is_refused_by_name(served, route, body, param):
    outcome = api_fuzz.send(served.base, route, body, KEY, triton=served.http)
    assert (outcome.status, outcome.problem) == (400, ""), outcome.text[:500]
    error = api_fuzz._json(outcome.text)["error"]
    if route == "/v1/messages":
        assert f"'{param}'" in error["message"], error
    else:
        assert error["param"] == param, error
    assert "Traceback" not in error["message"] and "recursion" not in error["message"], error
    assert not re.search(r"Traceback|Exception in ASGI", open(served.log).read())  # nor in the server's log
