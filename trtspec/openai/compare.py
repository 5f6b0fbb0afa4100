"""Two OpenAI-compatible deployments of one model, request by request (`trtspec compare`).

The served deployment (speculative) and a reference (the same model without speculation: trtspec's
target alone, trtllm-serve without a speculative_config) get the same seeded random requests:
/v1/completions and /v1/chat/completions, greedy (or seeded samples at a temperature, for
deployments that couple them: trtspec's Gumbel coupling), with stop sequences, penalties, n > 1,
streamed or not, every one asking for the two likeliest tokens' log-probabilities. Speculation is
lossless when every answer is the reference's: the same text, finish reason and token count.

Where two greedy answers part (requests without penalties: servers report log-probabilities before
them), the token where they part is looked up in the reference's log-probabilities: if the reference
chose its likeliest token there and the served token trails it by at most `tie_tolerance` nats (> 0),
they parted at a near tie (a GPU's bfloat16 arithmetic rounds differently at different batch shapes,
so two lossless deployments may part there); otherwise they differ.
"""

from __future__ import annotations

import http.client
import json
import random
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from trtspec.openai.client import base_url, bearer
from trtspec.triton.client import ClientError, answer_json, error_text, other_server, sse_events, unreachable

IDENTICAL, REFUSED, NEAR_TIE, DIFFERENT = "identical", "refused alike", "near tie", "different"
TOP = 2  # log-probabilities of the two likeliest tokens at each position
PENALTIES = ("presence_penalty", "frequency_penalty")  # a request's, which raw log-probabilities leave out
BUSY_RETRIES, MAX_RETRY_WAIT_S = 5, 30  # a busy server's 503: asked again after its Retry-After


@dataclass(frozen=True)
class Ask:
    """One request: its endpoint (`completions`, `chat/completions`) and body."""

    endpoint: str
    body: dict


@dataclass
class Choice:
    """One choice of an answer, with each token's text and the likeliest tokens' log-probabilities."""

    text: str = ""
    finish_reason: str | None = None
    tokens: list[str] = field(default_factory=list)
    top: list[dict[str, float]] = field(default_factory=list)  # per token: token text -> log p


@dataclass
class Answer:
    """A server's answer to one Ask: its choices and completion tokens, its refusal, or what broke it."""

    choices: list[Choice] = field(default_factory=list)
    completion_tokens: int | None = None
    refused: int | None = None  # the HTTP status of a refusal
    message: str = ""
    broken: str | None = None  # an error event mid-stream, a stream cut short or unreadable

    def refusal(self) -> tuple[str, int | None] | None:
        """What kind of no this answer is (None: an answer)."""
        if self.refused is not None:
            return ("HTTP", self.refused)
        return ("broken", None) if self.broken is not None else None

    def said(self) -> str:
        if self.refused is not None:
            return f"HTTP {self.refused}: {self.message[:120]}"
        return f"a broken answer ({self.broken[:120]})" if self.broken is not None else "an answer"


def asks(prompts: list[str], count: int, max_tokens: int, model: str, seed: int, temperature: float = 0.0,
         chat: bool = True) -> list[Ask]:
    """`count` seeded random requests over `prompts`: half of them chat turns (with `chat`), each with
    a random token budget up to `max_tokens` and, now and then, a stop sequence cut from its prompt,
    presence and frequency penalties, two choices, streaming."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        prompt = rng.choice(prompts)
        body: dict = {"model": model, "max_tokens": rng.randint(1, max_tokens), "temperature": temperature}
        if temperature > 0:
            body["seed"] = rng.randrange(2**31)
        if chat and rng.random() < 0.5:
            endpoint = "chat/completions"
            body |= {"messages": [{"role": "user", "content": prompt}], "logprobs": True, "top_logprobs": TOP}
        else:
            endpoint = "completions"
            body |= {"prompt": prompt, "logprobs": TOP}
        if rng.random() < 0.3 and prompt.strip():
            start = rng.randrange(len(prompt.strip()))
            body["stop"] = [prompt.strip()[start:start + rng.randint(1, 2)]]
        if rng.random() < 0.3:
            body["presence_penalty"] = round(rng.uniform(0.1, 1.0), 2)
            body["frequency_penalty"] = round(rng.uniform(0.1, 1.0), 2)
        if rng.random() < 0.2:
            body["n"] = 2
        if rng.random() < 0.5:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        out.append(Ask(endpoint, body))
    return out


def _logprobs(choice: dict, into: Choice) -> None:
    """A choice's (or stream chunk's) log-probabilities into `into`: completions' lists, chat's items."""
    logprobs = choice.get("logprobs") or {}
    if "content" in logprobs:  # chat
        for item in logprobs["content"] or ():
            into.tokens.append(item["token"])
            into.top.append({t["token"]: t["logprob"] for t in item.get("top_logprobs") or ()})
    else:  # completions
        into.tokens += logprobs.get("tokens") or []
        into.top += [dict(top or {}) for top in logprobs.get("top_logprobs") or []]


def _text(choice: dict) -> str:
    if "text" in choice:
        return choice["text"] or ""
    part = choice.get("message") or choice.get("delta") or {}
    return part.get("content") or ""


def answer(url: str, ask: Ask, api_key: str | None = None, timeout_s: float = 300.0) -> Answer:
    """`ask` sent to the OpenAI-compatible server at `url` (openai://HOST:PORT); its refusal (an
    HTTP error), or an answer that broke off, is an Answer too. A busy server's 503 with Retry-After
    is asked again after that wait, up to BUSY_RETRIES times. A server out of reach is a ClientError."""
    endpoint = f"{base_url(url)}/{ask.endpoint}"
    req = urllib.request.Request(endpoint, data=json.dumps(ask.body).encode(),
                                 headers={"Content-Type": "application/json", **bearer(api_key)})
    for attempt in range(BUSY_RETRIES + 1):
        try:
            resp = urllib.request.urlopen(req, timeout=timeout_s)
            break
        except urllib.error.HTTPError as exc:
            raw, wait = exc.read(), exc.headers.get("Retry-After", "")
            if exc.code == 503 and wait.isdigit() and attempt < BUSY_RETRIES:
                time.sleep(min(int(wait), MAX_RETRY_WAIT_S))
                continue
            wrong_port = other_server(exc.code, raw, "openai")  # no refusal: no OpenAI API there
            if wrong_port:
                raise ClientError(f"{endpoint}: HTTP {exc.code}: {error_text(raw)}{wrong_port}") from None
            return Answer(refused=exc.code, message=error_text(raw))
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError) as exc:
            raise ClientError(unreachable(endpoint, exc)) from None
        except OSError as exc:  # a timeout
            raise ClientError(f"cannot reach {endpoint}: {exc}") from None
    with resp:
        try:
            bodies = [answer_json(resp.read(), endpoint)] if not ask.body.get("stream") else \
                list(sse_events(resp, endpoint, until_done=True))
        except (OSError, http.client.HTTPException, ClientError) as exc:
            return Answer(broken=f"cut short or unreadable: {exc}")
    out = Answer()
    choices: dict[int, Choice] = {}
    for body in bodies:
        if not isinstance(body, dict):
            return Answer(broken=f"not a JSON object: {json.dumps(body)[:200]}")
        if "error" in body:  # an error event in a stream
            return Answer(broken=f"an error event: {json.dumps(body['error'])[:200]}")
        for choice in body.get("choices") or ():
            one = choices.setdefault(choice.get("index", 0), Choice())
            one.text += _text(choice)
            one.finish_reason = choice.get("finish_reason") or one.finish_reason
            _logprobs(choice, one)
        usage = body.get("usage")
        if usage:
            out.completion_tokens = usage.get("completion_tokens")
    out.choices = [choices[i] for i in sorted(choices)]
    return out


def judge(served: Answer, reference: Answer, tie_tolerance: float, ties: bool = True) -> tuple[str, str]:
    """(identical / refused alike / near tie / different, why) for two answers to one request.
    `ties`: whether parting at a near tie can pass: greedy answers whose log-probabilities are what
    the tokens were chosen by (no penalties: servers report raw log-probabilities, before them)."""
    if served.refusal() is not None or reference.refusal() is not None:
        if served.refusal() == reference.refusal():
            return REFUSED, served.said()
        return DIFFERENT, f"served {served.said()}; the reference {reference.said()}"
    if len(served.choices) != len(reference.choices):
        return DIFFERENT, f"{len(served.choices)} choices; the reference {len(reference.choices)}"
    verdict, why = IDENTICAL, ""
    for i, (a, b) in enumerate(zip(served.choices, reference.choices, strict=True)):
        if (a.text, a.finish_reason) == (b.text, b.finish_reason):
            continue
        # the first token where they part (None: one's tokens begin the other's, or none came)
        k = next((j for j, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=False)) if x != y), None)
        lead = None
        if ties and k is not None and k < len(b.top):
            lead = _lead(a.tokens[k], b.tokens[k], b.top[k])
        if lead is not None and lead <= tie_tolerance and tie_tolerance > 0:
            verdict = NEAR_TIE
            why = f"choice {i} parted at token {k} ({a.tokens[k]!r} for {b.tokens[k]!r}, {lead:.4f} nats " \
                  "behind in the reference)"
            continue
        at = "" if k is None else f" at token {k}"
        return DIFFERENT, f"choice {i} differs{at}: {a.text[:80]!r} ({a.finish_reason}) vs the reference's " \
                          f"{b.text[:80]!r} ({b.finish_reason})"
    if verdict == IDENTICAL and served.completion_tokens != reference.completion_tokens:
        return DIFFERENT, f"usage.completion_tokens {served.completion_tokens} vs the reference's " \
                          f"{reference.completion_tokens}"
    return verdict, why


def _lead(served: str, chosen: str, top: dict[str, float]) -> float | None:
    """How far the reference's log-probabilities put the served token behind the one the reference
    chose, where it chose its likeliest and both are among those it reports (else None)."""
    if chosen not in top or served not in top or top[chosen] < max(top.values()):
        return None
    return top[chosen] - top[served]


@dataclass
class Comparison:
    """Each request's verdict, in order."""

    asks: list[Ask]
    verdicts: list[tuple[str, str]]

    def count(self, verdict: str) -> int:
        return sum(v == verdict for v, _ in self.verdicts)

    @property
    def passed(self) -> bool:
        """No answer differs, and some were answered (requests both refuse check nothing)."""
        return self.count(DIFFERENT) == 0 and self.count(IDENTICAL) + self.count(NEAR_TIE) > 0

    def report(self, shown: int = 5) -> list[str]:
        lines = [f"{len(self.asks)} requests: {self.count(IDENTICAL)} identical, {self.count(NEAR_TIE)} "
                 f"parted at a near tie, {self.count(DIFFERENT)} different, {self.count(REFUSED)} refused by "
                 "both alike"]
        for kind in (DIFFERENT, NEAR_TIE, REFUSED):
            found = [(ask, why) for ask, (v, why) in zip(self.asks, self.verdicts, strict=True) if v == kind]
            for ask, why in found[:shown]:
                lines.append(f"  {kind.upper()}: {why}\n    POST /v1/{ask.endpoint} {json.dumps(ask.body)}")
            if len(found) > shown:
                lines.append(f"  … and {len(found) - shown} more {kind}")
        return lines


def compare_deployments(url: str, reference_url: str, requests: list[Ask], concurrency: int = 4,
                        tie_tolerance: float = 0.0, api_key: str | None = None,
                        reference_api_key: str | None = None, reference_model: str | None = None,
                        progress=None) -> Comparison:
    """Send every request to both servers (`concurrency` requests in flight, each to both at once;
    to the reference under `reference_model` where its name is another) and judge each pair of
    answers. A reference that refuses every request the deployment answers is a ClientError (a
    wrong --reference-url or --reference-model, not the deployment's fault)."""
    def one(ask: Ask) -> tuple[tuple[str, str], Answer]:
        alike = ask if reference_model is None else Ask(ask.endpoint, {**ask.body, "model": reference_model})
        with ThreadPoolExecutor(2) as both:
            served = both.submit(answer, url, ask, api_key)
            reference = both.submit(answer, reference_url, alike, reference_api_key)
            ties = not ask.body.get("temperature") and not any(k in ask.body for k in PENALTIES)
            verdict = judge(served.result(), reference.result(), tie_tolerance, ties)
        if progress is not None:
            progress()
        return verdict, reference.result()

    with ThreadPoolExecutor(concurrency) as pool:
        judged = list(pool.map(one, requests))
    references = [ref for _, ref in judged]
    if references and all(ref.refused is not None for ref in references) and \
            any(verdict != REFUSED for (verdict, _), _ in judged):
        raise ClientError(f"the reference at {reference_url} refused every request the deployment answered "
                          f"(the first: {references[0].said()}); check --reference-url and "
                          "--reference-model")
    return Comparison(requests, [verdict for verdict, _ in judged])
